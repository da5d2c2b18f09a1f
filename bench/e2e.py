"""End-to-end decode benchmark on one GPU: ar / spec / forced-acceptance modes, CUDA-graph steps.

    python bench/e2e.py --preset ocria-1-sim --batch 1 8 32 64 --out bench/results/e2e_h200.json

For each batch size: prefill the same document prompt into every row, then time graph-captured
decode steps (one graph launch + one async readback per step). ``oracle`` forces every draft to be
the target's own continuation, ``tau=X`` forces the first k ~ Binomial(B-1, (X-1)/(B-1)) drafts right
and the rest wrong (uniforms fixed per row and position, so a run is a function of its table), ``spec``
uses the (random) drafter as is. The drafter always runs; in the forced modes its selector head runs
too but does not cut the drafts sent to verification.

The forced modes read an oracle table of wanted tokens. ``ar``'s greedy tokens seed it, but in bf16
the ar path (T=1 steps) and the verify path (T=block steps) differ by rounding, a near-tie flips and
every later draft would be rejected. So before timing, a forced mode runs un-timed passes on the same
batch and block schedule and takes the tokens it emitted as the new table until a pass emits exactly
the table (every block fully accepted): a fixed point of the verify path itself. Each pass extends the
agreed prefix by at least one token (the verify outputs up to the first disagreement repeat), so the
cap (every token a pass can emit, + 2) is never the reason to stop; the passes are reported. Passes
run one block past the timed run and agree on every token the timed run emits in each row (fast rows
of ``tau=X`` run far past ``--tokens``) plus a block, so its last drafts read agreed positions too. Each forced run
records its passes and ``table_source``: ``ar`` when the passes only extended ar's table past its end,
``fixed_point`` when they rewrote a token the timed run reads (``table_first_rewrite``: the first one).

Checks, each failing the run: the timed tokens of a forced mode equal its table (exact: same
computation, same schedule); every spec-family run equals ``ar`` token for token (bf16 on both
sides), a first divergence accepted only where the two tokens' logit gap is under twice the measured
ar/verify path noise (a floating-point tie), and reported; an fp32 run of oracle and tau=8 vs ar.
Also: launches per step (profiler), host time per step, roofline fraction, HF transformers baseline,
``--profile``: every kernel of one eager ar and one eager oracle step at batch 1, the oracle step
split into drafter and target verify + commit.
``--recipe mixed`` (any fixed-rule recipe) quantizes the target's weights first, without calibration
(``ocria.quant.direct``): same bytes and kernels per step as a built engine of that recipe.
"""

import argparse
import datetime as dt
import functools
import io
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from ocria.builder.presets import load_preset, random_models
from ocria.data import LONG_PAGE, generate
from ocria.errors import ConfigError
from ocria.models import DrafterCache, TargetCache
from ocria.models.cache import cache_tensors
from ocria.models.config import LINEAR
from ocria.plugins.launch import pdl_launch
from ocria.plugins.switch import disabled_kernels, enabled_kernels, invariance_enabled
from ocria.quant.direct import quantize_in_place
from ocria.quant.recipe import load_recipe
from ocria.runtime.decode import SamplingTensors, prefill
from ocria.runtime.graphs import GraphDecoder
from ocria.runtime.processor import Processor
from ocria.train.evaluate import logit_gap

sys.path.insert(0, str(Path(__file__).parent))  # bench/timing.py, also when loaded by path (tests)
from timing import copy_bandwidth, kernel_table  # noqa: E402


class ForcedDrafter:
    """The real drafter runs; its proposals are replaced from an oracle table (graph-safe).

    ``table[slot, pos]`` is the wanted token at position ``pos``; the graph reads it in place, so the
    fixed-point passes rewrite it without a new capture. With ``tau`` the first k drafts stay right and
    the rest are made wrong, k counting uniforms under (tau - 1) / n drawn once per (slot, position):
    the same table gives the same schedule, as the fixed point needs.
    """

    def __init__(self, real, table: torch.Tensor, tau: float | None, seed: int = 0):
        self.real, self.table, self.tau = real, table, tau
        n = real.config.block_size - 1
        gen = torch.Generator(table.device).manual_seed(seed)
        self.draws = torch.rand(*table.shape, n, generator=gen, device=table.device) if tau is not None else None

    def __getattr__(self, name):
        return getattr(self.real, name)

    def verify_budget(self, conf):
        """Every forced draft goes to verification: the selector still runs (its cost stays in the
        step), its cut does not apply (a threshold would otherwise cap the forced acceptance)."""
        budget = self.real.verify_budget(conf)
        return None if budget is None else torch.full_like(budget, conf.shape[1])

    def propose(self, logits, cache, slots):
        n = logits.shape[1]
        pos = cache.ctx_len[slots].long().clamp(max=self.table.shape[1] - 1)
        idx = (pos[:, None] + 1 + torch.arange(n, device=slots.device)).clamp(max=self.table.shape[1] - 1)
        want = self.table[slots[:, None], idx]
        if self.tau is not None:
            k = (self.draws[slots, pos] < (self.tau - 1) / n).sum(1)
            wrong = torch.arange(n, device=slots.device)[None, :] >= k[:, None]
            want = torch.where(wrong, (want + 1) % logits.shape[-1], want)
        return want


def first_mismatch(want: list[int], got: list[int]) -> int | None:
    return next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), None)


def table_rows(table: torch.Tensor, start: int, tokens: list[list[int]]) -> list[list[int]]:
    """Each row's table entries over the positions its emitted tokens cover."""
    return [table[r, start: start + len(t)].tolist() for r, t in enumerate(tokens)]


def oracle_fixed_point(generate, table: torch.Tensor, start: int, max_passes: int) -> tuple[int, bool]:
    """Rewrite ``table`` in place until a pass of the forced mode emits exactly the table.

    ``generate(p)`` runs pass p (un-timed, same batch, graph and schedule as the timed run, but longer)
    and returns its tokens per row, token 0 at position ``start``, and how many of each row's tokens
    must agree: every token the timed run will emit in that row plus one block, so its last drafts read
    agreed positions too (the pass's own last block may read past what is known). Emitted tokens are
    the verify path's own greedy outputs, so they become the table. Each pass moves the first
    disagreement right by at least one token. Returns (passes, converged).
    """
    for p in range(1, max_passes + 1):
        tokens, agree = generate(p)
        head = [t[:n] for t, n in zip(tokens, agree)]
        if all(first_mismatch(w, t) is None for w, t in zip(table_rows(table, start, head), head)):
            return p, True
        for r, t in enumerate(tokens):
            table[r, start: start + len(t)] = torch.tensor(t, device=table.device)
    return max_passes, False


def agreed_lengths(lengths: list[list[int]], want: int, block: int) -> list[int]:
    """How many of a pass's tokens per row must equal the table: all the timed run emits (it stops at
    the first step where every row has more than ``want``; ``lengths`` are the rows' lengths after
    each step of the pass), plus one block its last drafts read."""
    stop = next(n for n in lengths if min(n) > want)
    return [n + block for n in stop]


def check_table(table: torch.Tensor, start: int, tokens: list[list[int]]) -> tuple[bool, list[dict]]:
    """A forced mode's timed tokens against its (fixed-point) table: exact, no tie allowance."""
    report = [{"row": r, "compared": len(t), "first_divergence": first_mismatch(w, t)}
              for r, (w, t) in enumerate(zip(table_rows(table, start, tokens), tokens))]
    return all(x["first_divergence"] is None for x in report), report


def param_bytes(module) -> int:
    """Bytes of a module's weights at their stored size: quantized linears keep theirs as buffers, and
    views (fused projections, gate/up halves of a fused GEMM) count their storage once."""
    storages = {}
    for t in [*module.parameters(), *module.buffers()]:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def step_bytes(target, drafter, rows: int, kv_len: int, spec: bool) -> int:
    """Bytes a decode step must move: weights once (tied head counted once, embeddings gathered),
    each GDN state read + written once per row, each row's attention KV read once."""
    cfg = target.text_config
    text = param_bytes(target.text) - param_bytes(target.text.embed_tokens)
    weights = text + param_bytes(target.lm_head)
    if spec:  # the drafter reads the head again (its first draft_vocab_size rows when set)
        vd = drafter.config.draft_vocab_size or cfg.vocab_size
        weights += param_bytes(drafter) + param_bytes(target.lm_head) * vd // cfg.vocab_size
    n_lin = cfg.layer_types.count(LINEAR)
    state = n_lin * cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4 * 2
    n_full = cfg.num_hidden_layers - n_lin
    elem = next(target.parameters()).element_size()
    kv = n_full * 2 * cfg.num_key_value_heads * cfg.head_dim * kv_len * elem
    return weights + rows * (state + kv)


def count_launches(fn) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    graph = sum(n in ("cudaGraphLaunch", "cuGraphLaunch") for n in names)
    kernels = sum(n in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC") for n in names)
    copies = sum(n.startswith("cudaMemcpy") for n in names)
    return {"graph_launches": graph, "kernel_launches": kernels, "memcpy_calls": copies,
            "launches_per_step": graph + kernels}


def prefill_rows(target, drafter, tcache, dcache, prompt, rows) -> list[int]:
    """Every row has the same prompt: prefill row 0 and copy its state into the others."""
    first = int(prefill(target, drafter, tcache, dcache, 0, prompt, chunk=1024).argmax(-1))
    dst = torch.arange(1, rows, device="cuda")
    caches = [tcache] + ([dcache] if dcache is not None else [])
    for cache in caches:
        for t in cache_tensors(cache):
            t[dst] = t[0].clone()
    return [first] * rows


def run_mode(target, drafter, prompt, rows, mode, table, args, source: str = "ar"):
    """Capture + profile on a throw-away generation, bring a forced mode's table to its fixed point,
    then time a fresh generation. Returns row dict + tokens. ``source`` says where ``table`` came from."""
    spec = mode != "ar"
    cfg, dc = target.text_config, drafter.config
    L = prompt.input_ids.numel()
    T = dc.block_size if spec else 1
    steps = args.tokens if not spec else args.tokens + 2
    max_len = L + (steps + 2) * T + 64
    # Caches in the weights' dtype, as the engine allocates them: an fp32 model over bf16 caches reads
    # earlier tokens back rounded in ar steps but not inside a verify block, which is bf16-sized path noise.
    dtype = next(target.parameters()).dtype
    tcache = TargetCache.allocate(cfg, rows + 1, max_len, dc.block_size, dtype, "cuda")
    dcache = DrafterCache.allocate(dc.num_hidden_layers, dc.num_key_value_heads, dc.head_dim, rows + 1, max_len,
                                   dtype, "cuda") if spec else None
    use = {"ar": None, "spec": drafter, "oracle": ForcedDrafter(drafter, table, None)}.get(mode)
    if mode.startswith("tau="):
        use = ForcedDrafter(drafter, table, float(mode[4:]))
    real = use.real if isinstance(use, ForcedDrafter) else use
    graph = GraphDecoder(target, use, tcache, dcache, pad_slot=rows, max_batch=rows)
    zeros = torch.zeros(rows, device="cuda")
    params = SamplingTensors(zeros, torch.ones(rows, device="cuda"), zeros.long(), zeros.long())
    slots = list(range(rows))
    horizon = L + steps * T  # one attention-length bucket for the whole run, fixed-point passes included
    first = prefill_rows(target, real, tcache, dcache, prompt, rows)
    graph.step(slots, first, params, spec, horizon, True, ("warm", mode))
    launches = count_launches(lambda: graph.step(slots, first, None, spec, horizon, True, ("warm", mode)))

    def generate(tag, want: int) -> tuple[list[list[int]], dict]:
        """Prefill every row, then graph steps until each row has ``want`` tokens after its first."""
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        first = prefill_rows(target, real, tcache, dcache, prompt, rows)
        torch.cuda.synchronize()
        ttft_ms = (time.perf_counter() - t0) * 1e3  # one prompt prefill (the other rows copy its state)
        tokens = [[t] for t in first]
        step_ms, wall_ms, lengths, acc_total = [], [], [], 0
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        n = 0
        while min(len(t) for t in tokens) <= want:  # every step emits a token per row
            w0 = time.perf_counter()
            start.record()
            out, acc, _ = graph.step(slots, [t[-1] for t in tokens], params, spec, horizon, True, tag)
            end.record()
            wall_ms.append((time.perf_counter() - w0) * 1e3)
            end.synchronize()  # the step waits for its readback only, which can finish before ``end``
            step_ms.append(start.elapsed_time(end))
            n += 1
            for r in range(rows):
                tokens[r] += out[r, : int(acc[r]) + 1].tolist()
            lengths.append([len(t) for t in tokens])
            acc_total += int(acc.sum())
        tau = (acc_total + rows * n) / (rows * n)
        return tokens, {"steps": n, "lengths": lengths, "step_ms": step_ms, "wall_ms": wall_ms,
                        "ttft_ms": ttft_ms, "tau": tau}

    forced = {}
    if isinstance(use, ForcedDrafter):
        # passes run one block further than the timed run and agree on all it emits
        def agreed_pass(p):
            tokens, st = generate(("pass", mode, p), args.tokens + T)
            return tokens, agreed_lengths(st["lengths"], args.tokens, T)

        before = table[:rows, L: L + args.tokens + 1].clone()
        passes, converged = oracle_fixed_point(agreed_pass, table, L, steps * T + 2)
        # where the passes rewrote what the timed run reads (not just extended the table past it)
        changed = (table[:rows, L: L + args.tokens + 1] != before).any(0).nonzero()
        rewrite = int(changed[0]) if changed.numel() else None
        source = source if rewrite is None else "fixed_point"
        forced = {"table_source": source, "oracle_passes": passes, "oracle_converged": converged,
                  "table_first_rewrite": rewrite}
    tokens, st = generate(("timed", mode), args.tokens)
    if not spec:
        for r in range(rows):
            table[r, L: L + len(tokens[r])] = torch.tensor(tokens[r], device="cuda")
    step_ms, wall_ms = st["step_ms"], st["wall_ms"]
    med_step, med_wall = statistics.median(step_ms[1:] or step_ms), statistics.median(wall_ms[1:] or wall_ms)
    row = {"batch": rows, "mode": mode, "steps": st["steps"], "step_ms": med_step, "wall_ms_per_step": med_wall,
           "host_ms_per_step": max(med_wall - med_step, 0.0), "host_fraction": max(med_wall - med_step, 0) / med_wall,
           "mean_acceptance_length": st["tau"], "tokens_per_s": rows * st["tau"] / (med_wall / 1e3),
           "ttft_ms": st["ttft_ms"], "launches": launches, "kv_len_end": L + max(len(t) for t in tokens), **forced}
    return row, tokens


@functools.lru_cache(maxsize=256)
def _margin(target, prompt_key, prefix: tuple[int, ...], a: int, b: int) -> float:
    return logit_gap(target, _PROMPTS[prompt_key], list(prefix), a, b)


_PROMPTS: dict[int, object] = {}


def divergence_margin(target, prompt, ar: list[int], spec: list[int], i: int) -> float:
    """Logit gap between ar's and spec's token at generated index i, from a fresh full forward
    (cached: rows with the same prompt diverge identically)."""
    _PROMPTS[id(prompt)] = prompt
    return _margin(target, id(prompt), tuple(ar[:i]), ar[i], spec[i])


@torch.no_grad()
def step_logits(target, prompt, tokens: list[int], chunk: int) -> torch.Tensor:
    """Logits [1, len(tokens), V] of ``tokens`` teacher-forced after ``prompt``'s prefill, in decode steps of
    ``chunk`` tokens (1: the ar path; the block size: the verify path)."""
    cfg = target.text_config
    L, n = prompt.input_ids.numel(), len(tokens)
    embed = target.text.embed_tokens.weight
    cache = TargetCache.allocate(cfg, 1, L + n + chunk, chunk, embed.dtype, embed.device)
    prefill(target, None, cache, None, 0, prompt, chunk=1024)
    slot = torch.zeros(1, dtype=torch.long, device=embed.device)
    ids = torch.tensor(tokens, device=embed.device)[None]
    out = []
    for s in range(0, n, chunk):
        index = cache.kv_len[slot].long()[:, None] + torch.arange(chunk, device=embed.device)
        pos = (index + cache.rope_delta[slot][:, None]).expand(3, 1, chunk)
        hidden, _ = target.forward_cached(target.text.embed_tokens(ids[:, s:s + chunk]), pos, cache, slot,
                                          "verify", attn_len=L + n)
        cache.commit(slot, torch.full((1,), chunk, device=embed.device))
        out.append(target.logits(hidden))
    return torch.cat(out, 1)


def path_noise(target, prompt, tokens: list[int], block: int) -> float:
    """Max |logit| difference between the ar path (T=1 steps) and the verify path (one T=block step)
    on the same teacher-forced tokens: how far apart the two computations are in this precision."""
    tokens = tokens[:block]
    return float((step_logits(target, prompt, tokens, 1) - step_logits(target, prompt, tokens, block)).abs().max())


def check_lossless(target, prompt, ar_tokens, spec_tokens, tie_margin):
    """Compare each row up to the shorter length; a divergence is tolerated only at a tie, i.e. where
    ar's logit gap between the two tokens is within ``tie_margin`` (the measured path noise)."""
    report = []
    for r, (a, s) in enumerate(zip(ar_tokens, spec_tokens)):
        n = min(len(a), len(s))
        diff = next((i for i in range(n) if a[i] != s[i]), None)
        entry = {"row": r, "compared": n, "first_divergence": diff}
        if diff is not None:
            entry["logit_gap"] = divergence_margin(target, prompt, a, s, diff)
            entry["tie"] = entry["logit_gap"] <= tie_margin
        report.append(entry)
    return all(x["first_divergence"] is None or x["tie"] for x in report), report


def record_table_check(results, table, start, tokens, row, precision: str) -> bool:
    """Forced mode: the timed tokens must equal the table they were forced from; stored in results."""
    ok, report = check_table(table, start, tokens)
    results["table_checks"].append({"precision": precision, "batch": row["batch"], "mode": row["mode"], "ok": ok,
                                    **{k: row[k] for k in ("table_source", "oracle_passes", "oracle_converged",
                                                             "table_first_rewrite")},
                                    "rows": report})
    if not ok:
        print(f"B={row['batch']} {row['mode']} ({precision}): timed tokens differ from the oracle table", flush=True)
    return ok


def set_draft_vocab(drafter, args) -> None:
    """``--draft-vocab N`` overrides the preset's ``draft_vocab_size`` (0: the whole vocabulary), for A/B runs."""
    if args.draft_vocab is None:
        return
    try:
        drafter.config.check_draft_vocab(args.draft_vocab, drafter.lm_head.weight.shape[0])
    except ConfigError as e:
        raise SystemExit(f"--draft-vocab {args.draft_vocab}: {e}") from None
    drafter.config.draft_vocab_size = args.draft_vocab


def plugin_switch(args) -> bool | None:
    """``--plugins on``: every kernel on CUDA except those named in OCRIA_DISABLE_KERNELS (A/B runs)."""
    return None if args.plugins == "on" else False


def fp32_check(preset, prompt, args, results) -> bool:
    """spec == ar on the same weights in fp32 (oracle and tau=8), where no tie should flip."""
    target, drafter = random_models(preset, "cuda", torch.float32)
    set_draft_vocab(drafter, args)
    target.set_plugins(plugin_switch(args))
    table = torch.zeros(args.fp32_check + 1, prompt.input_ids.numel() + args.tokens * 2 + 64, dtype=torch.long,
                        device="cuda")
    _, ar = run_mode(target, drafter, prompt, args.fp32_check, "ar", table, args)
    ok_all, source = True, "ar"
    for mode in ("oracle", "tau=8"):
        row, spec = run_mode(target, drafter, prompt, args.fp32_check, mode, table, args, source)
        source = row["table_source"]
        ok, report = check_lossless(target, prompt, ar, spec, 1e-3)
        ok_all &= ok & record_table_check(results, table, prompt.input_ids.numel(), spec, row, "fp32")
        results["lossless"].append({"precision": "fp32", "batch": args.fp32_check, "mode": mode, "ok": ok,
                                    "mean_acceptance_length": row["mean_acceptance_length"], "rows": report})
        print(f"fp32 {mode}: lossless {ok}, tau {row['mean_acceptance_length']:.2f}, "
              f"table {source} after {row['oracle_passes']} passes", flush=True)
    del target, drafter
    torch.cuda.empty_cache()
    return ok_all


class DrafterRanges:
    """A drafter whose step calls run inside profiler ranges ``drafter.<method>``, so a profile can
    tell the drafter's kernels from the target's without touching the model code."""

    METHODS = ("draft", "propose", "verify_budget", "append_context")

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name not in self.METHODS:
            return attr

        def ranged(*a, **kw):
            with torch.profiler.record_function(f"drafter.{name}"):
                return attr(*a, **kw)

        return ranged


@torch.no_grad()
def profile_steps(target, drafter, prompt) -> dict:
    """Every CUDA kernel of one eager ar step and one eager oracle step (draft + verify + commit) at
    batch 1: where the time inside the graph goes, and which small kernels are left to fuse."""
    from torch.profiler import ProfilerActivity, profile

    from ocria.runtime.decode import decode_step

    cfg, dc = target.text_config, drafter.config
    L = prompt.input_ids.numel()
    dtype = next(target.parameters()).dtype
    slot = torch.zeros(1, dtype=torch.long, device="cuda")
    zero = torch.zeros(1, device="cuda")
    params = SamplingTensors(zero, torch.ones(1, device="cuda"), zero.long(), zero.long())
    table = torch.zeros(1, L + 256, dtype=torch.long, device="cuda")  # the wanted tokens do not change the kernels
    out = {}
    for mode in ("ar", "oracle"):
        spec = mode != "ar"
        tcache = TargetCache.allocate(cfg, 1, L + 256, dc.block_size, dtype, "cuda")
        dcache = DrafterCache.allocate(dc.num_hidden_layers, dc.num_key_value_heads, dc.head_dim, 1, L + 256, dtype,
                                       "cuda") if spec else None
        use = DrafterRanges(ForcedDrafter(drafter, table, None)) if spec else None
        last = prefill(target, drafter if spec else None, tcache, dcache, 0, prompt).argmax(-1)
        for _ in range(3):
            decode_step(target, use, tcache, dcache, slot, last, params, L + 64, True)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            decode_step(target, use, tcache, dcache, slot, last, params, L + 64, True)
            torch.cuda.synchronize()
        ranges = tuple(f"drafter.{m}" for m in DrafterRanges.METHODS) if spec else ()
        table_ = kernel_table(prof, ranges)
        r = {"total_kernel_us": table_["total_kernel_us"], "kernels": table_["kernels"]}
        if spec:
            drafter_us = sum(x["total_us"] for x in table_["ranges"].values())
            drafter_n = sum(x["kernels"] for x in table_["ranges"].values())
            r.update(drafter_us=drafter_us, drafter_kernels=drafter_n, target_verify_commit_us=r["total_kernel_us"] -
                     drafter_us, target_verify_commit_kernels=r["kernels"] - drafter_n, ranges=table_["ranges"])
        r.update(top=table_["all_kernels"][:20], all_kernels=table_["all_kernels"])
        out[mode] = r
        print(f"eager {mode} step (B=1): {r['kernels']} kernels, {r['total_kernel_us'] / 1e3:.3f} ms of kernel time"
              + (f"; drafter {r['drafter_kernels']} kernels {r['drafter_us'] / 1e3:.3f} ms, target verify + commit "
                 f"{r['target_verify_commit_kernels']} kernels {r['target_verify_commit_us'] / 1e3:.3f} ms"
                 if spec else ""), flush=True)
        for k in r["top"]:
            print(f"  {k['total_us']:9.1f} us  {k['calls']:4d}x  {k['kernel'][:90]}", flush=True)
        del tcache, dcache
    return out


def hf_baseline(target, prompt_ids, batch, new_tokens):
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    cfg = Qwen3_5Config(**target.config.to_hf())
    with torch.device("cuda"):
        hf = Qwen3_5ForConditionalGeneration(cfg).to(torch.bfloat16).eval()
    missing, unexpected = hf.load_state_dict(target.state_dict(), strict=False)
    if unexpected or any(not k.startswith("lm_head") for k in missing):
        raise RuntimeError(f"HF weights do not match: missing {missing[:3]}, unexpected {unexpected[:3]}")
    ids = prompt_ids[None].repeat(batch, 1).cuda()
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    hf.generate(ids, max_new_tokens=4, do_sample=False)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    hf.generate(ids, **kw)
    torch.cuda.synchronize()
    dt_s = time.perf_counter() - t0
    return {"batch": batch, "new_tokens": new_tokens, "seconds": dt_s, "tokens_per_s": batch * new_tokens / dt_s}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="ocria-1-sim")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--modes", nargs="+", default=["ar", "oracle", "tau=8", "spec"])
    ap.add_argument("--tokens", type=int, default=48, help="tokens generated per row and mode")
    ap.add_argument("--fp32-check", type=int, default=8, help="rows of the exact fp32 spec == ar check (0: off)")
    ap.add_argument("--profile", action="store_true",
                    help="list every kernel of one eager ar and one eager oracle step at batch 1")
    ap.add_argument("--hf", type=int, nargs="*", default=[1, 8], help="HF generate baseline batch sizes")
    ap.add_argument("--plugins", choices=("on", "off"), default="on", help="ReplaySSM Triton kernels or reference")
    ap.add_argument("--no-fuse", action="store_true", help="keep projections as separate GEMMs")
    ap.add_argument("--draft-vocab", type=int, help="drafter's draft_vocab_size instead of the preset's (0: all ids)")
    ap.add_argument("--recipe", default="bf16",
                    help="quantize the target's weights with this recipe (no calibration: ocria.quant.direct)")
    ap.add_argument("--out", default="bench/results/e2e_h200.json")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 check must be fp32
    preset = load_preset(args.preset)
    bw = copy_bandwidth()
    target, drafter = random_models(preset, "cuda", torch.bfloat16)
    set_draft_vocab(drafter, args)
    formats = quantize_in_place(target, load_recipe(args.recipe)) if args.recipe != "bf16" else {}
    target.set_plugins(plugin_switch(args))
    drafter.set_plugins(plugin_switch(args))
    if not args.no_fuse:
        target.text.fuse_projections()
        drafter.fuse_projections()
    proc = Processor(preset.assets)
    buf = io.BytesIO()
    generate(7, kind="page", config=LONG_PAGE).image.save(buf, format="PNG")
    prompt = proc.prepare(buf.getvalue())
    results = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
               "gpu": torch.cuda.get_device_name(), "command": " ".join(["python", *sys.argv]),
               "torch": torch.__version__, "preset": args.preset, "plugins": args.plugins,
               "disabled_kernels": sorted(disabled_kernels()),
               "enabled_kernels": sorted(enabled_kernels()), "pdl": pdl_launch(torch.device("cuda")),
               "batch_invariant": invariance_enabled(),
               "recipe": args.recipe,
               "quantized_layers": {f: list(formats.values()).count(f) for f in set(formats.values())},
               "fused_projections": not args.no_fuse, "draft_vocab_size": drafter.config.draft_vocab_size,
               "prompt_tokens": prompt.input_ids.numel(),
               "copy_bandwidth_GBps": bw / 1e9, "target_params": sum(p.numel() for p in target.text.parameters()),
               "drafter_params": sum(p.numel() for p in drafter.parameters()), "runs": [], "lossless": [],
               "table_checks": []}
    try:
        results["git"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    all_ok = True
    if args.fp32_check:
        all_ok &= fp32_check(preset, prompt, args, results)
    if args.profile:
        prof = profile_steps(target, drafter, prompt)
        results["profile_ar_b1"], results["profile_oracle_b1"] = prof["ar"], prof["oracle"]
    noise = path_noise(target, prompt, [1 + i for i in range(16)], drafter.config.block_size)
    results["bf16_path_noise"] = noise
    print(f"bf16 logit noise between ar and verify paths: {noise:.4f}", flush=True)
    for rows in args.batch:
        table = torch.zeros(rows + 1, prompt.input_ids.numel() + args.tokens * 2 + 64, dtype=torch.long,
                            device="cuda")
        ar_tokens, source = None, "empty"
        for mode in args.modes:
            row, tokens = run_mode(target, drafter, prompt, rows, mode, table, args, source)
            if "table_source" in row:
                source = row["table_source"]
                all_ok &= record_table_check(results, table, prompt.input_ids.numel(), tokens, row, "bf16")
            nbytes = step_bytes(target, drafter, rows, row["kv_len_end"], mode != "ar")
            nominal = {"ar": 1.0, "oracle": float(drafter.config.block_size)}.get(
                mode, float(mode[4:]) if mode.startswith("tau=") else None)
            if nominal is not None:  # step cost is shape-fixed: throughput at the mode's nominal acceptance
                row["tokens_per_s_nominal"] = rows * nominal / (row["wall_ms_per_step"] / 1e3)
            floor_ms = nbytes / bw * 1e3
            row.update(step_bytes=nbytes, floor_ms=floor_ms, roofline_fraction=floor_ms / row["step_ms"])
            if mode == "ar":
                ar_tokens, source = tokens, "ar"
            elif ar_tokens is not None:
                ok, report = check_lossless(target, prompt, ar_tokens, tokens, 2 * noise)
                all_ok &= ok
                results["lossless"].append({"batch": rows, "mode": mode, "ok": ok, "rows": report})
            results["runs"].append(row)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(results, indent=2) + "\n")  # partial results survive a timeout
            torch.cuda.empty_cache()
            print(f"B={rows:3d} {mode:7s} step {row['step_ms']:7.3f} ms  host {row['host_ms_per_step']:6.3f} ms  "
                  f"tau {row['mean_acceptance_length']:5.2f}  {row['tokens_per_s']:9.1f} tok/s  "
                  f"roofline {row['roofline_fraction']:.2f}  launches {row['launches']}"
                  + (f"  table {source} ({row['oracle_passes']} passes)" if "table_source" in row else ""), flush=True)
    results["hf_baseline"] = []
    text_ids = prompt.input_ids[prompt.input_ids != proc.image_token_id][:512]
    for b in args.hf if args.recipe == "bf16" else []:  # HF runs the unquantized checkpoint only
        try:
            results["hf_baseline"].append(hf_baseline(target, text_ids, b, 64))
            print("HF", results["hf_baseline"][-1], flush=True)
        except Exception as e:  # the baseline must not hide our own results
            results["hf_baseline"].append({"batch": b, "error": f"{type(e).__name__}: {e}"})
    results["lossless_ok"] = all_ok
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    plot(results, out.with_suffix(".png"))
    print_table(results)
    return 0 if all_ok else 1


def plot(results, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    modes = sorted({r["mode"] for r in results["runs"]}, key=lambda m: (m != "ar", m))
    for m in modes:
        rs = [r for r in results["runs"] if r["mode"] == m]
        a.plot([r["batch"] for r in rs], [r["tokens_per_s"] for r in rs], marker="o", label=m)
        b.plot([r["batch"] for r in rs], [r["step_ms"] for r in rs], marker="o", label=m)
    for h in results.get("hf_baseline", []):
        if "tokens_per_s" in h:
            a.scatter([h["batch"]], [h["tokens_per_s"]], marker="x", color="k")
    a.set(xscale="log", yscale="log", xlabel="batch", ylabel="tokens/s",
          title=f"{results['preset']} on {results['gpu']}")
    b.set(xscale="log", xlabel="batch", ylabel="step time (ms)", title="decode step (x: HF generate)")
    a.legend()
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_table(results):
    print(f"\n{'batch':>5} {'mode':>7} {'step ms':>8} {'host ms':>8} {'tau':>5} {'tok/s':>9} {'nominal':>9} "
          f"{'roofline':>8} {'launches':>8} table")
    for r in results["runs"]:
        print(f"{r['batch']:5d} {r['mode']:>7} {r['step_ms']:8.3f} {r['host_ms_per_step']:8.3f} "
              f"{r['mean_acceptance_length']:5.2f} {r['tokens_per_s']:9.1f} {r.get('tokens_per_s_nominal', 0):9.1f} "
              f"{r['roofline_fraction']:8.2f} "
              f"{r['launches']['launches_per_step'] if r['launches'] else '-':>8} "
              f"{r.get('table_source', '')} {r.get('oracle_passes', '')}")
    for h in results["hf_baseline"]:
        print("HF generate", h)
    print("lossless:", "ok" if results["lossless_ok"] else "VIOLATED", "| forced tokens == table:",
          all(c["ok"] for c in results["table_checks"]))


if __name__ == "__main__":
    sys.exit(main())
