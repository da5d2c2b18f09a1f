"""Check, time and compare the plugin kernels of the registry (``bench.ops.registry``).

For each selected op, shape and variant: the variant against the op's reference first (a variant that fails its
check is reported as failed and not timed), then on CUDA its median µs (CUDA graph over rotating input copies),
achieved GB/s, the fraction of the device's copy bandwidth its bytes floor would take, and its time over the
baseline's. ``--device cpu`` checks the tiny shapes in Triton's interpreter and times nothing.

    python -m bench.ops.run --op decode_gemm --shape sim_mlp_down_m1 --out /tmp/gemm.json
    python -m bench.ops.run --op replay_ssm_verify --base HEAD~1      # both revisions' medians and their ratio
    python -m bench.ops.run --device cpu --invariance                  # checks and row invariance, interpreter
    python -m bench.ops.run --op silu_quant_nvfp4 --ptxas              # registers and spills for sm_90a, no GPU
"""

from __future__ import annotations

import argparse
import os
import sys
import zlib
from dataclasses import asdict, dataclass, replace

USAGE_ERROR = 2


@dataclass
class Row:
    """One op, shape and variant: its check and, on CUDA, its time."""

    op: str
    shape: str
    variant: str
    ok: bool
    worst: float
    reason: str = ""
    floor_bytes: int = 0
    floor_flops: int = 0
    us: float | None = None
    gbps: float | None = None
    floor_fraction: float | None = None
    over_baseline: float | None = None
    base_us: float | None = None
    over_base: float | None = None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.ops.run", description=__doc__.split("\n")[0])
    ap.add_argument("--op", nargs="+", default=None, help="ops to run (default: all)")
    ap.add_argument("--shape", nargs="+", default=None, help="shape names (default: every preset shape on CUDA, "
                                                             "the cpu shapes on CPU)")
    ap.add_argument("--variant", nargs="+", default=None, help="variants besides the reference (default: all)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available")
    ap.add_argument("--base", metavar="REV", default=None, help="also run the selection at git revision REV")
    ap.add_argument("--out", default=None, help="write the result JSON here")
    ap.add_argument("--invariance", action="store_true",
                    help="check each op's rows alone against inside a batch, with batch-invariant rows (the "
                         "policy's for_steps), instead of timing")
    ap.add_argument("--ptxas", action="store_true", help="compile the kernel variants for sm_90a (no GPU needed): "
                                                         "registers, spills, instructions")
    return ap.parse_args(argv)


def select(ops: dict, names: list[str] | None) -> list:
    """The registered ops named (all when None); ValueError naming an unknown one."""
    if names is None:
        return list(ops.values())
    unknown = [n for n in names if n not in ops]
    if unknown:
        raise ValueError(f"unknown op {unknown[0]!r}; known: {', '.join(ops)}")
    return [ops[n] for n in names]


def shapes_of(op, names: list[str] | None, device: str) -> list:
    """The op's shapes named (those it has), else its cpu shapes on CPU and the others on CUDA."""
    if names is not None:
        return [s for s in op.shapes if s.name in names]
    return [s for s in op.shapes if s.cpu == (device == "cpu")]


def run_op(op, shapes: list, variants: list[str] | None, device: str, roof: float | None = None,
           timer=None) -> list[Row]:
    """Check (and with ``timer`` time) each variant of ``op`` on each shape.

    Args:
        op: an ``OpBench``.
        shapes: the shapes to run.
        variants: variant names besides the reference (None: all the op has).
        device: ``cuda`` or ``cpu`` (CUDA-only variants are left out on CPU).
        roof: the device's copy bandwidth in bytes/s (for the floor fraction).
        timer: (call, input copies) -> median µs; None: checks only.
    Returns:
        One row per shape and variant, the reference first; a variant that fails its check has no time.
    """
    import torch

    from bench.ops.check import compare
    from bench.ops.measure import input_copies
    from bench.ops.registry import Variant, clone_inputs

    rows = []
    dev = torch.device(device)
    names = [v for v in op.variants if variants is None or v in variants]
    for s in shapes:
        g = torch.Generator(dev).manual_seed(zlib.crc32(s.name.encode()))
        inputs = op.inputs(s, dev, g)
        fresh = clone_inputs if op.mutates else (lambda i: i)
        want = op.reference(fresh(inputs))
        floor = op.floor(s)
        copies = input_copies(op, s, inputs) if timer else []
        timed, first = {}, len(rows)
        for name, variant in [("reference", Variant(op.reference, kernel=False)),
                              *((n, op.variants[n]) for n in names)]:
            if variant.cuda_only and device != "cuda":
                continue
            try:
                result = compare(variant.call(fresh(inputs)), want, op.check)
            except Exception as e:  # a variant that raises is a failed row, the others still run
                row = Row(op.name, s.name, name, False, float("inf"), f"{type(e).__name__}: {str(e)[:200]}")
            else:
                row = Row(op.name, s.name, name, result.ok, result.worst, result.reason)
            row.floor_bytes, row.floor_flops = floor.bytes, floor.flops
            if row.ok and timer is not None:
                row.us = timer(variant.call, [fresh(c) for c in copies] if op.mutates else copies)
                row.gbps = floor.bytes / row.us * 1e-3
                row.floor_fraction = floor.bytes / (row.us * 1e-6) / roof if roof else None
                timed[name] = row.us
            rows.append(row)
        base = timed.get(op.baseline) or timed.get("reference")  # the baseline, else the reference
        for row in rows[first:]:
            if row.us is not None and base:
                row.over_baseline = row.us / base
    return rows


def print_rows(rows: list[Row]) -> None:
    print(f"{'op':26} {'shape':28} {'variant':12} {'check':6} {'µs':>9} {'GB/s':>7} {'floor':>6} {'x base':>7}"
          f"{'  base µs  x rev':>17}")
    for r in rows:
        check = "ok" if r.ok else "FAIL"
        us = f"{r.us:9.2f}" if r.us is not None else f"{'-':>9}"
        gbps = f"{r.gbps:7.0f}" if r.gbps is not None else f"{'-':>7}"
        frac = f"{r.floor_fraction:6.2f}" if r.floor_fraction is not None else f"{'-':>6}"
        ratio = f"{r.over_baseline:7.2f}" if r.over_baseline is not None else f"{'-':>7}"
        base = f"  {r.base_us:8.2f} {r.over_base:6.2f}" if r.base_us is not None else ""
        print(f"{r.op:26} {r.shape:28} {r.variant:12} {check:6} {us} {gbps} {frac} {ratio}{base}"
              + (f"  {r.reason}" if r.reason else ""), flush=True)


def run_invariance(ops: list, shape_names: list[str] | None, device: str) -> list:
    """``invariance.check_rows`` of every kernel variant of each op that has row-wise inputs."""
    import torch

    from bench.ops.invariance import check_rows

    results = []
    for op in ops:
        if op.rows is None:
            continue
        for s in shapes_of(op, shape_names, device):
            inputs = op.inputs(s, torch.device(device), torch.Generator(device).manual_seed(1))
            for name, variant in op.variants.items():
                if variant.kernel and not (variant.cuda_only and device != "cuda"):
                    r = check_rows(op, s.name, name, inputs)
                    print(f"{r.op:26} {r.shape:28} {r.variant:12} {'invariant' if r.ok else 'DIFFERS: '}"
                          f"{', '.join(r.differing)}", flush=True)
                    results.append(r)
    return results


def run_ptxas(ops: list, shape_names: list[str] | None, variants: list[str] | None) -> list[dict]:
    """Each op's ``ptxas`` builds on its preset shapes (or those named)."""
    from bench.ops.ptxas import build_summary, compile_build

    out = []
    for op in ops:
        for name, build_of in op.ptxas.items():
            if variants is not None and name not in variants:
                continue
            for s in shapes_of(op, shape_names, "cuda"):
                stats = build_summary(compile_build(build_of(s)))
                print(f"{op.name:26} {s.name:28} {name:12} {stats['registers']:4d} registers, "
                      f"{stats['spill_store_bytes']}/{stats['spill_load_bytes']} B spilled, "
                      f"{stats['instructions']} SASS instructions", flush=True)
                out.append({"op": op.name, "shape": s.name, "variant": name, **stats})
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = args.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.ptxas and os.environ.get("TRITON_INTERPRET") == "1":
        print("bench.ops.run: --ptxas compiles with Triton for real; unset TRITON_INTERPRET", file=sys.stderr)
        return USAGE_ERROR
    if device == "cpu" and not args.ptxas:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

    from bench.ops.registry import all_ops
    from ocria.bench.results import result_header, write_json

    try:
        ops = select(all_ops(), args.op)
    except ValueError as e:
        print(f"bench.ops.run: {e}", file=sys.stderr)
        return USAGE_ERROR
    result = {**result_header("ops"), "run_device": device}
    ok = True
    if args.ptxas:
        result["ptxas"] = run_ptxas(ops, args.shape, args.variant)
    elif args.invariance:
        found = run_invariance(ops, args.shape, device)
        result["invariance"] = [asdict(r) for r in found]
        ok = all(r.ok for r in found)
    else:
        rows = run_selection(ops, args, device, result)
        ok = all(r.ok for r in rows)
        if args.base:
            rows = compare_base(rows, args, device)
            result["base"] = args.base
        result["rows"] = [asdict(r) for r in rows]
        print_rows(rows)
    result["ok"] = ok
    if args.out:
        write_json(result, args.out)
    return 0 if ok else 1


def run_selection(ops: list, args: argparse.Namespace, device: str, result: dict) -> list[Row]:
    """Every selected op's rows; on CUDA timed against the device's measured copy bandwidth (in ``result``)."""
    roof, timer = None, None
    if device == "cuda":
        from bench.ops.measure import time_variant
        from ocria.bench.timing import copy_bandwidth

        roof, timer = copy_bandwidth(), time_variant
        result["copy_bandwidth_GBps"] = roof / 1e9
        print(f"copy bandwidth {roof / 1e9:.0f} GB/s", flush=True)
    rows = []
    for op in ops:
        rows += run_op(op, shapes_of(op, args.shape, device), args.variant, device, roof, timer)
    return rows


def compare_base(rows: list[Row], args: argparse.Namespace, device: str) -> list[Row]:
    """``rows`` with the medians of the same selection at ``args.base`` and this revision's time over it."""
    from bench.ops.base import run_at_revision

    argv = ["--device", device]
    for flag, values in (("--op", args.op), ("--shape", args.shape), ("--variant", args.variant)):
        if values:
            argv += [flag, *values]
    base = {(r["op"], r["shape"], r["variant"]): r.get("us") for r in run_at_revision(args.base, argv)["rows"]}
    out = []
    for r in rows:
        base_us = base.get((r.op, r.shape, r.variant))
        out.append(replace(r, base_us=base_us, over_base=r.us / base_us if r.us and base_us else None))
    return out


if __name__ == "__main__":
    raise SystemExit(main())
