"""Diagnostic: logit difference between the ar path (T=1 steps) and the verify path (one T=16 step)
on the same teacher-forced tokens, fp32 and bf16, ReplaySSM Triton kernels on and off.

    python bench/path_noise.py --out bench/results/path_noise_h200.json

With ``--engine``: that engine's target (any recipe) on held-out documents, over 16-token windows covering
its whole greedy answer (the prompt and the answer before the window prefilled): the noise scale that
``python -m ocria.train eval``'s logit gaps at spec/ar divergences are to be read against.

    python bench/path_noise.py --engine engines/ocria-mini-mixed --device cpu --docs 92 368 --out ...

With ``--runtime`` as well: ``spec`` through the scheduler, each step's verify logits (accepted rows, up to the
first spec/ar divergence) against a clean recompute of the same positions, and both margins of ar's token over
spec's at that divergence: every path difference the runtime has, not only T=1 against T=block.

With ``--layers`` as well: where the two paths part, layer by layer: over the first block-multiple of tokens of
each answer, every decoder layer's, mixer's and MLP's output on the ar path against the verify path (max
difference, relative to the layer's largest output, first differing position), and the GDN gates of layer 0 on a
one-token call against a 16-token call.

    python bench/path_noise.py --engine engines/ocria-mini-mixed --device cpu --layers --docs 2 --out ...
"""

import argparse
import datetime as dt
import io
import json
import sys
from pathlib import Path

import torch

import ocria.runtime.scheduler as scheduler
from ocria.bench.engine import path_noise, step_logits
from ocria.builder.presets import load_preset, random_models
from ocria.data import LONG_PAGE, generate
from ocria.runtime.engine import Engine
from ocria.runtime.processor import PreparedPrompt, Processor
from ocria.train.evaluate import heldout_pngs, transcribe


def heldout_answer(engine: Engine, doc: int) -> tuple[bytes, list[int]]:
    """Held-out document ``doc``'s PNG and the engine's greedy ``ar`` answer (token ids, never empty)."""
    image = heldout_pngs(1, start=doc)[0][0]
    answer = transcribe(engine, [image], "ar", 384, 1)[0]["tokens"]
    if not answer:
        raise SystemExit(f"held-out document {doc}: the engine's answer is empty, nothing to compare")
    return image, answer


def after(prompt: PreparedPrompt, tokens: list[int]) -> PreparedPrompt:
    """``prompt`` with ``tokens`` appended to its text: the prefix a step at that point of the answer follows."""
    ids = torch.cat([prompt.input_ids, torch.tensor(tokens, dtype=torch.long)])
    return PreparedPrompt(ids, prompt.pixel_values, prompt.image_grid_thw)


def engine_noise(engine_dir: str, device: str, docs: list[int]) -> list[dict]:
    """Per held-out document: the largest ar-vs-verify logit difference over block-wide windows that cover its
    whole answer (the last one ends at the answer's end)."""
    engine = Engine(engine_dir, device=device)
    block = engine.block_size
    rows = []
    for doc in docs:
        image, answer = heldout_answer(engine, doc)
        prompt = engine.processor.prepare(image)
        width = min(block, len(answer))
        starts = list(range(0, len(answer) - width + 1, width))
        if starts[-1] + width < len(answer):
            starts.append(len(answer) - width)  # the tail, overlapping the window before it
        noise = 0.0
        for start in starts:
            noise = max(noise, path_noise(engine.target, after(prompt, answer[:start]), answer[start:start + width],
                                          width))
        rows.append({"doc": doc, "answer_tokens": len(answer), "max_abs_logit_diff": noise})
        print(rows[-1], flush=True)
    return rows


def runtime_noise(engine_dir: str, device: str, docs: list[int]) -> list[dict]:
    """Per held-out document: ``spec`` through the scheduler (batch 1), each step's verify logits on its accepted
    rows against a clean recompute (the prompt and the answer so far prefilled, one verify step over ar's tokens),
    and at the first spec/ar divergence the margin of ar's token over spec's on both. Every path difference the
    runtime really has is in this figure (prefill chunks, rollbacks, attention lengths); ``engine_noise``
    isolates the T=1 / T=block one."""
    engine = Engine(engine_dir, device=device)
    target, step = engine.target, scheduler.decode_step
    steps: list[dict] = []

    def recording_step(*args, **kwargs):  # decode_step, keeping the logits of its one target.logits call
        seen = []

        def logits(hidden: torch.Tensor) -> torch.Tensor:
            seen.append(type(target).logits(target, hidden))
            return seen[-1]

        target.logits = logits
        try:
            result = step(*args, **kwargs)
        finally:
            del target.logits
        steps.append({"accepted": int(result.accepted[0]), "logits": seen[-1][0]})
        return result

    rows = []
    for doc in docs:
        image, ar = heldout_answer(engine, doc)
        prompt = engine.processor.prepare(image)
        steps.clear()
        scheduler.decode_step = recording_step
        try:
            spec = transcribe(engine, [image], "spec", 384, 1)[0]["tokens"]
        finally:
            scheduler.decode_step = step
        div = next((i for i in range(min(len(ar), len(spec))) if ar[i] != spec[i]), None)
        row = {"doc": doc, "steps": len(steps), "first_divergence": div, "max_abs_logit_diff": 0.0}
        done = 1  # answer tokens before this step's block: the first came from the prefill
        for st in steps:
            n, T = st["accepted"] + 1, st["logits"].shape[0]
            if div is not None and done > div:
                break
            clean = step_logits(target, after(prompt, ar[:done - 1]), (ar[done - 1:] + [ar[-1]] * T)[:T], T)[0]
            rows_n = min(n, len(ar) - done + 1)  # row j reads ar[done - 1 + j]: past the answer, nothing to compare
            if div is not None:
                rows_n = min(rows_n, div - done + 1)
            diff = float((clean[:rows_n] - st["logits"][:rows_n]).abs().max())
            row["max_abs_logit_diff"] = max(row["max_abs_logit_diff"], diff)
            if div is not None and done <= div < done + n:
                j, a, b = div - done, ar[div], spec[div]
                runtime = st["logits"][j]
                row.update(ar_token=a, spec_token=b, runtime_verify_margin=float(runtime[a] - runtime[b]),
                           clean_verify_margin=float(clean[j, a] - clean[j, b]))
            done += n
        rows.append(row)
        print(row, flush=True)
    return rows


def _recorder(seen: dict[str, list[torch.Tensor]], name: str):
    """A forward hook keeping a module's output rows (the first tensor of a tuple) under ``name``."""
    def hook(module, inputs, output):
        out = output[0] if isinstance(output, tuple) else output
        seen.setdefault(name, []).append(out.detach().reshape(-1, out.shape[-1]))
    return hook


def layer_noise(engine_dir: str, device: str, docs: list[int]) -> list[dict]:
    """Per held-out document and decoder layer (its mixer and MLP too): the ar path's outputs (T=1 steps) against
    the verify path's (block-wide steps) on the same teacher-forced answer tokens."""
    engine = Engine(engine_dir, device=device)
    target, block = engine.target, engine.block_size
    modules = {}
    for i, layer in enumerate(target.text.layers):
        modules[f"layer {i}"] = layer
        for part in ("linear_attn", "self_attn", "mlp"):
            if hasattr(layer, part):
                modules[f"layer {i} {part}"] = getattr(layer, part)
    rows = []
    for doc in docs:
        image, answer = heldout_answer(engine, doc)
        width = min(block, len(answer))  # an answer shorter than a block is verified as one step of its length
        tokens = answer[: len(answer) // width * width]
        prompt = engine.processor.prepare(image)
        outputs: dict[int, dict[str, list[torch.Tensor]]] = {}
        for chunk in (1, width):
            hooks = [m.register_forward_hook(_recorder(outputs.setdefault(chunk, {}), name))
                     for name, m in modules.items()]
            try:
                step_logits(target, prompt, tokens, chunk)
            finally:
                for h in hooks:
                    h.remove()
        layers = []
        for name in modules:  # the first call of each module is the prefill, the same on both paths
            ar, verify = (torch.cat(outputs[c][name][1:]).float() for c in (1, width))
            diff = (ar - verify).abs()
            differing = diff.amax(-1).nonzero()
            layers.append({"module": name, "max_abs_diff": float(diff.max()),
                           "relative": float(diff.max() / ar.abs().max().clamp_min(1e-30)),
                           "first_differing_position": int(differing[0]) if differing.numel() else None})
        rows.append({"doc": doc, "tokens": len(tokens), "verify_width": width, "layers": layers})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def gate_noise(device: str, heads: int = 16, seed: int = 0) -> dict:
    """The GDN gates (softplus, exp, sigmoid) of one token computed alone against the same token inside a
    16-token call: CPU elementwise kernels take other code paths (vector body or scalar tail) by tensor size."""
    from ocria.plugins.replay_ssm.reference import gdn_gates

    gen = torch.Generator().manual_seed(seed)
    a, b = (torch.randn(1, 16, heads, generator=gen).to(device) for _ in range(2))
    A_log, dt_bias = (torch.randn(heads, generator=gen).to(device) for _ in range(2))
    g16, beta16 = gdn_gates(a, b, A_log, dt_bias)
    tokens_g = tokens_beta = 0
    relative = 0.0
    for t in range(16):
        g1, beta1 = gdn_gates(a[:, t:t + 1], b[:, t:t + 1], A_log, dt_bias)
        tokens_g += int(not torch.equal(g1, g16[:, t:t + 1]))
        tokens_beta += int(not torch.equal(beta1, beta16[:, t:t + 1]))
        for one, block in ((g1, g16[:, t:t + 1]), (beta1, beta16[:, t:t + 1])):
            relative = max(relative, float(((one - block).abs() / block.abs().clamp_min(1e-30)).max()))
    return {"heads": heads, "tokens": 16, "tokens_with_other_g": tokens_g, "tokens_with_other_beta": tokens_beta,
            "max_relative_diff": relative}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="ocria-1-sim")
    ap.add_argument("--engine", help="measure this engine's target on held-out documents instead")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--docs", type=int, nargs="+", default=[0], help="held-out document indices (with --engine)")
    ap.add_argument("--runtime", action="store_true",
                    help="with --engine: the scheduler's own spec steps against clean recomputes (runtime_noise)")
    ap.add_argument("--layers", action="store_true",
                    help="with --engine: where the ar and verify paths part, layer by layer (layer_noise)")
    ap.add_argument("--out", default="bench/results/path_noise_h200.json")
    args = ap.parse_args()
    if (args.runtime or args.layers) and not args.engine:
        raise SystemExit("--runtime and --layers need --engine")
    if args.runtime and args.layers:
        raise SystemExit("--runtime and --layers are two diagnostics: choose one")
    if args.engine:
        measure = runtime_noise if args.runtime else layer_noise if args.layers else engine_noise
        rows = measure(args.engine, args.device, args.docs)
        out = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "device": args.device,
               "engine": args.engine, "command": " ".join(["python", *sys.argv]), "rows": rows}
        if args.layers:
            out["gdn_gates"] = gate_noise(args.device)
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
        return 0
    preset = load_preset(args.preset)
    buf = io.BytesIO()
    generate(7, kind="page", config=LONG_PAGE).image.save(buf, format="PNG")
    prompt = Processor(preset.assets).prepare(buf.getvalue())
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        target, drafter = random_models(preset, "cuda", dtype)
        for plugins in (True, False):
            target.set_plugins(plugins)
            noise = path_noise(target, prompt, [1 + i for i in range(16)], drafter.config.block_size)
            rows.append({"dtype": str(dtype), "plugins": plugins, "max_abs_logit_diff": noise})
            print(rows[-1], flush=True)
        del target, drafter
        torch.cuda.empty_cache()
    out = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "gpu": torch.cuda.get_device_name(),
           "command": " ".join(["python", *sys.argv]), "rows": rows}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
