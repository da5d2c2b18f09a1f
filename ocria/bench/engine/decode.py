"""Decoding and timing one (batch, mode): caches, the stepper (CUDA graph or eager), timed generations, the row."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ocria.bench.engine.config import PREFILL_CHUNK, Mode
from ocria.bench.engine.models import Models
from ocria.bench.engine.oracle import ForcedDrafter, agreed_lengths, oracle_fixed_point, reach

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from ocria.models import DrafterCache, TargetCache
    from ocria.plugins.policy import ExecutionPolicy
    from ocria.runtime.processor import PreparedPrompt


class EagerDecoder:
    """``GraphDecoder.step`` without a graph (CPU): the same ``decode_step`` run eagerly, its inputs kept from one
    step to the next as the graph keeps them, the same host outputs."""

    def __init__(self, target, drafter, tcache: TargetCache, dcache: DrafterCache | None, policy: ExecutionPolicy):
        self.target, self.drafter, self.tcache, self.dcache = target, drafter, tcache, dcache
        self.policy = policy
        self.composition: tuple | None = None
        self.slots = self.last = self.params = None

    def step(self, slots: list[int], last: list[int], params, spec: bool, max_len: int, greedy: bool,
             composition: tuple) -> tuple[Tensor, Tensor, Tensor]:
        import torch

        from ocria.runtime.decode import decode_step

        if composition != self.composition:
            dev = self.tcache.kv_len.device
            self.slots = torch.tensor(slots, device=dev)
            self.last = torch.tensor(last, device=dev)
            self.params = params if params is not None else self.params
            self.composition = composition
        T = self.drafter.config.block_size if spec else 1
        res = decode_step(self.target, self.drafter if spec else None, self.tcache, self.dcache if spec else None,
                          self.slots, self.last, self.params, min(max_len + T, self.tcache.max_len), greedy,
                          self.policy)
        self.last = res.tokens.gather(1, res.accepted[:, None])[:, 0]
        return res.tokens, res.accepted, res.proposed


@dataclass
class ModeRun:
    """One (batch, mode)'s fixed state: caches, the stepper (a CUDA graph or eager), the sampling inputs."""

    models: Models
    prompt: PreparedPrompt
    rows: int
    mode: Mode
    drafter: Any  # what the step drafts with: None (ar), the drafter, or a ForcedDrafter around it
    tcache: TargetCache
    dcache: DrafterCache | None
    decoder: Any  # GraphDecoder (CUDA) or EagerDecoder
    params: Any  # SamplingTensors
    horizon: int  # the attention length bound of every step of the run (fixed-point passes included)

    @property
    def block(self) -> int:
        return self.models.block if self.mode.spec else 1

    @property
    def real_drafter(self):
        return self.drafter.real if isinstance(self.drafter, ForcedDrafter) else self.drafter

    @property
    def cuda(self) -> bool:
        return self.models.device.type == "cuda"


@dataclass
class Generation:
    """One generation of every row: tokens and per-step timings."""

    tokens: list[list[int]]
    steps: int
    lengths: list[list[int]]  # rows' lengths after each step
    step_ms: list[float]  # device time (CUDA events) or, on CPU, the step's wall time
    wall_ms: list[float]
    ttft_ms: float
    tau: float  # mean tokens per row and step


@dataclass
class ForcedTable:
    """How a forced mode's table was settled."""

    table_source: str  # "ar", "fixed_point" or "empty"
    oracle_passes: int
    oracle_converged: bool
    table_first_rewrite: int | None


@dataclass
class RunRow:
    """One (batch, mode) result row. GPU-only measurements are None on CPU."""

    batch: int
    mode: str
    steps: int
    step_ms: float
    wall_ms_per_step: float
    host_ms_per_step: float | None
    host_fraction: float | None
    mean_acceptance_length: float
    tokens_per_s: float
    ttft_ms: float
    launches: dict | None
    kv_len_end: int
    tokens_per_s_nominal: float | None = None
    step_bytes: int | None = None
    floor_ms: float | None = None
    roofline_fraction: float | None = None
    spec_equals_ar: bool | None = None  # spec-family modes against ar's tokens (None: ar itself, or no ar run)
    table_source: str | None = None
    oracle_passes: int | None = None
    oracle_converged: bool | None = None
    table_first_rewrite: int | None = None


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); nothing on CPU."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def greedy_params(rows: int, device: torch.device):
    """Greedy sampling inputs (``SamplingTensors``) for ``rows`` rows: temperature 0, top-p 1, no top-k, seed 0."""
    import torch

    from ocria.runtime.decode import SamplingTensors

    zeros = torch.zeros(rows, device=device)
    return SamplingTensors(zeros, torch.ones(rows, device=device), zeros.long(), zeros.long())


def drafter_cache(drafter, slots: int, max_len: int, dtype: torch.dtype, device: torch.device) -> DrafterCache:
    """A drafter KV cache of ``slots`` slots of ``max_len`` positions, shaped by the drafter's config."""
    from ocria.models import DrafterCache

    c = drafter.config
    return DrafterCache.allocate(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, slots, max_len, dtype, device)


def setup_run(models: Models, prompt: PreparedPrompt, rows: int, mode: Mode, table: Tensor, tokens: int) -> ModeRun:
    """Caches for ``rows`` (+ a pad slot), the stepper and sampling inputs of one mode.

    Args:
        models: what the run benchmarks.
        prompt: the document prompt every row prefills.
        rows: the batch size.
        mode: the decode mode.
        table: the oracle table [rows + 1, width] a forced mode drafts from (read in place).
        tokens: tokens the timed run generates per row (bounds the caches' length).
    Returns:
        The run's fixed state.
    """
    from ocria.models import TargetCache
    from ocria.runtime.graphs import GraphDecoder

    target, dc, dev = models.target, models.drafter, models.device
    L = prompt.input_ids.numel()
    horizon = L + reach(mode, tokens, models.block)
    max_len = horizon + models.block + 64
    # Caches in the weights' dtype, as the engine allocates them: an fp32 model over bf16 caches reads earlier
    # tokens back rounded in ar steps but not inside a verify block, which is bf16-sized path noise.
    tcache = TargetCache.allocate(target.text_config, rows + 1, max_len, models.block, models.dtype, dev)
    dcache = drafter_cache(dc, rows + 1, max_len, models.dtype, dev) if mode.spec else None
    use = None
    if mode.forced:
        use = ForcedDrafter(dc, table, mode.tau)
    elif mode.spec:
        use = dc
    if dev.type == "cuda":
        decoder = GraphDecoder(target, use, tcache, dcache, pad_slot=rows, max_batch=rows, policy=models.policy)
    else:
        decoder = EagerDecoder(target, use, tcache, dcache, models.policy)
    return ModeRun(models, prompt, rows, mode, use, tcache, dcache, decoder, greedy_params(rows, dev), horizon)


def prefill_rows(run: ModeRun) -> list[int]:
    """Every row has the same prompt: prefill row 0 and copy its state into the others; returns first tokens."""
    import torch

    from ocria.models.cache import cache_tensors
    from ocria.runtime.decode import prefill

    first = int(prefill(run.models.target, run.real_drafter, run.tcache, run.dcache, 0, run.prompt,
                        chunk=PREFILL_CHUNK, policy=run.models.policy).argmax(-1))
    dst = torch.arange(1, run.rows, device=run.models.device)
    for cache in [run.tcache] + ([run.dcache] if run.dcache is not None else []):
        for t in cache_tensors(cache):
            t[dst] = t[0].clone()
    return [first] * run.rows


def count_launches(fn: Callable[[], Any]) -> dict:
    """CUDA graph and kernel launches (and memcpy calls) of one call of ``fn``, from the profiler's CPU events."""
    import torch
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


def warm_up(run: ModeRun) -> dict | None:
    """Capture the step (CUDA) or run it once (CPU) on a throw-away generation; on CUDA, count one step's
    launches."""
    slots = list(range(run.rows))
    first = prefill_rows(run)
    tag = ("warm", run.mode.name)
    run.decoder.step(slots, first, run.params, run.mode.spec, run.horizon, True, tag)
    if not run.cuda:
        return None
    return count_launches(lambda: run.decoder.step(slots, first, None, run.mode.spec, run.horizon, True, tag))


def generate(run: ModeRun, tag: tuple, want: int) -> Generation:
    """Prefill every row, then decode steps until each row has ``want`` tokens after its first."""
    import torch

    dev = run.models.device
    sync(dev)
    t0 = time.perf_counter()
    first = prefill_rows(run)
    sync(dev)
    ttft_ms = (time.perf_counter() - t0) * 1e3  # one prompt prefill (the other rows copy its state)
    tokens = [[t] for t in first]
    slots = list(range(run.rows))
    step_ms, wall_ms, lengths, accepted = [], [], [], 0
    events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if run.cuda else None
    while min(len(t) for t in tokens) <= want:  # every step emits a token per row
        w0 = time.perf_counter()
        if events:
            events[0].record()
        out, acc, _ = run.decoder.step(slots, [t[-1] for t in tokens], run.params, run.mode.spec, run.horizon, True,
                                       tag)
        if events:
            events[1].record()
        wall_ms.append((time.perf_counter() - w0) * 1e3)
        if events:
            events[1].synchronize()  # the step waits for its readback only, which can finish before the end event
            step_ms.append(events[0].elapsed_time(events[1]))
        else:
            step_ms.append(wall_ms[-1])
        out, acc = out.cpu(), acc.cpu()
        for r in range(run.rows):
            tokens[r] += out[r, : int(acc[r]) + 1].tolist()
        lengths.append([len(t) for t in tokens])
        accepted += int(acc.sum())
    n = len(step_ms)
    return Generation(tokens, n, lengths, step_ms, wall_ms, ttft_ms, (accepted + run.rows * n) / (run.rows * n))


def settle_table(run: ModeRun, table: Tensor, tokens: int, source: str) -> ForcedTable:
    """Bring a forced mode's table to its fixed point: passes one block longer than the timed run, agreeing on
    everything it emits. ``source`` says where ``table`` came from."""
    L, T = run.prompt.input_ids.numel(), run.block

    def agreed_pass(p: int) -> tuple[list[list[int]], list[int]]:
        gen = generate(run, ("pass", run.mode.name, p), tokens + T)
        return gen.tokens, agreed_lengths(gen.lengths, tokens, T)

    before = table[:run.rows, L: L + tokens + 1].clone()
    passes, converged = oracle_fixed_point(agreed_pass, table, L, reach(run.mode, tokens, T) + 2)
    # where the passes rewrote what the timed run reads (not just extended the table past it)
    changed = (table[:run.rows, L: L + tokens + 1] != before).any(0).nonzero()
    rewrite = int(changed[0]) if changed.numel() else None
    return ForcedTable(source if rewrite is None else "fixed_point", passes, converged, rewrite)


def summarize(run: ModeRun, gen: Generation, launches: dict | None, forced: ForcedTable | None) -> RunRow:
    """A run's row: medians over the steps after the first (the first may still warm caches)."""
    med_step = statistics.median(gen.step_ms[1:] or gen.step_ms)
    med_wall = statistics.median(gen.wall_ms[1:] or gen.wall_ms)
    host = max(med_wall - med_step, 0.0) if run.cuda else None
    row = RunRow(batch=run.rows, mode=run.mode.name, steps=gen.steps, step_ms=med_step, wall_ms_per_step=med_wall,
                 host_ms_per_step=host, host_fraction=host / med_wall if host is not None else None,
                 mean_acceptance_length=gen.tau, tokens_per_s=run.rows * gen.tau / (med_wall / 1e3),
                 ttft_ms=gen.ttft_ms, launches=launches,
                 kv_len_end=run.prompt.input_ids.numel() + max(len(t) for t in gen.tokens))
    if forced is not None:
        row.table_source, row.oracle_passes = forced.table_source, forced.oracle_passes
        row.oracle_converged, row.table_first_rewrite = forced.oracle_converged, forced.table_first_rewrite
    nominal = run.mode.nominal(run.models.block)
    if nominal is not None:  # step cost is shape-fixed: throughput at the mode's nominal acceptance
        row.tokens_per_s_nominal = run.rows * nominal / (med_wall / 1e3)
    return row


def time_mode(models: Models, prompt: PreparedPrompt, rows: int, mode: Mode, table: Tensor, tokens: int,
              source: str = "ar") -> tuple[RunRow, list[list[int]]]:
    """Capture + profile on a throw-away generation, bring a forced mode's table to its fixed point, then time a
    fresh generation. ``ar`` writes its tokens into ``table`` (the forced modes' seed)."""
    import torch

    run = setup_run(models, prompt, rows, mode, table, tokens)
    launches = warm_up(run)
    forced = settle_table(run, table, tokens, source) if mode.forced else None
    gen = generate(run, ("timed", mode.name), tokens)
    if not mode.spec:
        L = prompt.input_ids.numel()
        for r in range(rows):
            table[r, L: L + len(gen.tokens[r])] = torch.tensor(gen.tokens[r], device=table.device)
    return summarize(run, gen, launches, forced), gen.tokens

