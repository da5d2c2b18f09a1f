"""``ocria bench formats``: the format cost table of an engine's decode GEMMs on this device.

    ocria bench formats --preset ocria-1-sim --device cuda --out costs.json
    ocria-build engine --preset ocria-1-sim --recipe auto --format-costs costs.json ...

For every distinct GEMM of a decode step (``ocria.quant.costs.decode_gemms``: the fused input projections, the output
projections, the MLP's and the LM head) and every format, the kernel a batch-invariant decode step runs for a layer
of that format is timed at each row count M: bf16 ``ocria::decode_gemm``, FP8 the FP8 GEMM on an input already
quantized (per token; the norm or SiLU before it writes the FP8 input), NVFP4 the weight-only GEMM. On CUDA each is
timed with CUDA events over CUDA-graph replays after a warm-up call, over rotating weight copies
(``ocria.bench.timing.rotation_copies``: the weights come from HBM as in a step); on CPU (tests, tiny models) with the
wall clock, the median of a few calls after a warm-up. The output is the table ``ocria-build engine --format-costs``
reads, with this run's header, the copy bandwidth and each GEMM's weight-bytes floor (CUDA).

This module's top-level imports stay light: torch and the models are imported by the functions that use them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from ocria.bench.results import result_header, write_json
from ocria.errors import OcriaError

DEFAULT_FORMATS = ("bf16", "fp8", "nvfp4")
CPU_CALLS = 3


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", help="engine directory whose target's shapes to time (from ocria-build engine)")
    p.add_argument("--preset", help="model preset whose shapes to time instead (e.g. ocria-1-sim)")
    p.add_argument("--device", default="auto", help="cuda, cpu or auto (cuda when there is one)")
    p.add_argument("--rows", type=int, nargs="+", help="row counts M to time (default: 1 2 4 8 16 32 64)")
    p.add_argument("--formats", nargs="+", default=list(DEFAULT_FORMATS), help="formats to time")
    p.add_argument("--gemms", nargs="+", help="only these GEMMs (default: every GEMM of a decode step)")
    p.add_argument("--plugins", choices=("auto", "on", "off"), default="auto",
                   help="Triton plugin kernels: auto = on CUDA only; on = every kernel (CPU: Triton's interpreter)")
    p.add_argument("--out", required=True, help="result JSON: the format cost table")


def _config(args: argparse.Namespace):
    from ocria.builder.presets import load_preset
    from ocria.models.config import OCRiaConfig, read_config_json

    if (args.engine is None) == (args.preset is None):
        raise OcriaError("name the model: --engine DIR (a built engine) or --preset NAME, one of them")
    if args.engine is not None:
        config = Path(args.engine) / "target" / "config.json"
        if not config.is_file():
            raise OcriaError(f"--engine {args.engine}: no target/config.json there")
        return OCRiaConfig.from_dict(read_config_json(config)).text
    return OCRiaConfig.from_dict(load_preset(args.preset).target).text


def _check_args(args: argparse.Namespace) -> tuple[tuple[int, ...], tuple[str, ...]]:
    from ocria.models.quantized.formats import FORMATS
    from ocria.quant.costs import DEFAULT_ROWS

    rows = tuple(args.rows or DEFAULT_ROWS)
    if any(m < 1 for m in rows) or len(set(rows)) != len(rows):
        raise OcriaError(f"--rows {list(rows)}: distinct row counts of at least 1")
    formats = tuple(args.formats)
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats or "bf16" not in formats:
        raise OcriaError(f"--formats {list(formats)}: a subset of {', '.join(FORMATS)} with bf16 (the baseline)")
    if Path(args.out).suffix != ".json":
        raise OcriaError(f"--out {args.out}: must end in .json")
    return rows, formats


def executors(fmt: str, weight, policy):
    """A function of the input x [M, K] bf16 that runs one GEMM of ``weight`` [N, K] as a decode step runs a layer
    stored in ``fmt``, and the function that prepares its input (FP8: the quantized bytes and per-token scales)."""
    import torch

    from ocria.models.quantized.linear import QuantLinear
    from ocria.plugins import numerics as nx
    from ocria.plugins.decode_gemm import decode_gemm
    from ocria.quant.direct import quantize_weight

    if fmt == "bf16":
        return (lambda x: decode_gemm(x, weight, policy=policy)), (lambda x: x)
    t = quantize_weight(weight, fmt)
    layer = QuantLinear(fmt, t["weight"], None, t["weight_scale"], t.get("weight_scale_2"), name=f"{fmt} gemm")
    if fmt == "fp8":
        return (lambda qs: layer.forward_fp8(qs[0], qs[1], torch.bfloat16, policy)), nx.quantize_fp8_per_token
    return (lambda x: layer(x, policy)), (lambda x: x)


def time_gemm(fmt: str, k: int, n: int, rows: tuple[int, ...], device, policy) -> list[float]:
    """µs per call of one ``fmt`` GEMM of [n, k] at each row count, in a batch-invariant step (``policy``'s
    ``for_steps``: the kernels a decode step runs)."""
    import torch

    from ocria.bench.timing import rotation_copies

    bytes_bf16 = 2 * n * k
    copies = rotation_copies(bytes_bf16) if device.type == "cuda" else 1
    gen = torch.Generator(device=device).manual_seed(0)
    weights = [torch.randn(n, k, generator=gen, device=device).mul_(0.02).to(torch.bfloat16) for _ in range(copies)]
    runs = [executors(fmt, w, policy.for_steps()) for w in weights]
    del weights
    out = []
    for m in rows:
        x = torch.randn(m, k, generator=gen, device=device).to(torch.bfloat16)
        inputs = [prepare(x) for _, prepare in runs]
        calls = [lambda run=run, inp=inp: run(inp) for (run, _), inp in zip(runs, inputs, strict=True)]
        out.append(_time(calls, device))
    return out


def _time(calls: list, device) -> float:
    if device.type == "cuda":
        from ocria.bench.timing import time_calls

        return time_calls(calls)
    calls[0]()  # warm-up (the interpreter compiles nothing, but the first call builds caches)
    times = []
    for _ in range(CPU_CALLS):
        t0 = time.perf_counter()
        calls[0]()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def run(args: argparse.Namespace) -> int:
    """``ocria bench formats``: write the table; 0 on success (2 for bad flags, from the CLI)."""
    import torch

    from ocria.bench.engine.config import resolve_device
    from ocria.bench.timing import copy_bandwidth
    from ocria.models.quantized.formats import FORMAT_BITS
    from ocria.plugins.policy import ExecutionPolicy
    from ocria.quant.costs import CostSource, CostTable, decode_gemms

    rows, formats = _check_args(args)
    gemms = decode_gemms(_config(args))
    if args.gemms:
        unknown = sorted(set(args.gemms) - {g.name for g in gemms})
        if unknown:
            raise OcriaError(f"--gemms {unknown[0]}: not a GEMM of this model ({', '.join(g.name for g in gemms)})")
        gemms = [g for g in gemms if g.name in args.gemms]
    device = torch.device(resolve_device(args.device))
    policy = ExecutionPolicy.from_env(args.plugins)
    cuda = device.type == "cuda"
    bandwidth = copy_bandwidth() if cuda else None
    us, floors = {}, {}
    with torch.no_grad():
        for g in gemms:
            us[g.name] = {}
            for fmt in formats:
                us[g.name][fmt] = [round(t, 3) for t in time_gemm(fmt, g.k, g.n, rows, device, policy)]
                print(f"{g.name:26s} [{g.n}, {g.k}] {fmt:6s} " + " ".join(f"M={m}: {t:8.2f} us"
                                                                       for m, t in zip(rows, us[g.name][fmt])),
                      flush=True)
            if bandwidth is not None:
                floors[g.name] = {f: round(g.n * g.k * FORMAT_BITS[f] / 8 / bandwidth * 1e6, 3) for f in formats}
    arch = "sm_{}{}".format(*torch.cuda.get_device_capability(device)) if cuda else "cpu"
    header = result_header("formats")
    extra = {"header": header, "plugins": args.plugins}
    if bandwidth is not None:
        extra.update(copy_bandwidth_TBps=round(bandwidth / 1e12, 3), weight_bytes_floor_us=floors)
    table = CostTable(arch, CostSource.MEASURED, header["device"], rows, {g.name: (g.k, g.n) for g in gemms}, us,
                      "each format's decode GEMM, batch-invariant kernels, "
                      + ("CUDA-graph replays timed with CUDA events over rotating weights" if cuda
                         else "wall clock on the CPU (the kernels' reference or interpreter: not a GPU's costs)"),
                      extra)
    write_json(table.to_json(), args.out)
    print(f"format cost table ({arch}) written to {args.out}")
    return 0
