"""A/B of ReplaySSM kernel variants in one device call: each checked against float64, then timed in interleaved rounds.

A variant is a copy of ``ocria/plugins/replay_ssm/kernel.py`` (the committed file, or one with a patch from
``bench/results`` applied) plus module attributes and environment variables set while its rows run. Each variant
loads its file as a module of its own, so settings never leak between variants; rows use ``replay_ssm.bench_row``
(graph-timed, rotating slot sets, no baselines) and ``replay_ssm.check_correctness``.

    cp ocria/plugins/replay_ssm/kernel.py /tmp/fused.py
    patch /tmp/fused.py CHANGE.patch
    python bench/replay_ssm_ab.py --variant head=ocria/plugins/replay_ssm/kernel.py \
        --variant fused96=/tmp/fused.py:FUSED_MAX_REGISTERS=96 \
        --variant pdl=ocria/plugins/replay_ssm/kernel.py:env.OCRIA_PDL=1 \
        --rows 8x16 32x16 --rounds 2 --out bench/results/replay_ssm_ab.json
A variant that may hang the GPU (a kernel waiting on something that never comes) is best checked in a child process
with ``--check-timeout SECONDS``: a check that fails or outlives it is recorded under ``correctness`` and the variant
is left out of the timing, so the call still times the others.
CPU smoke run (Triton interpreter, tiny heads, no timing worth reading):
    TRITON_INTERPRET=1 python bench/replay_ssm_ab.py --device cpu --heads 2 4 32 --rows 2x3 --rounds 1 \
        --check-batches 3 --rotate-mib 0 --variant head=ocria/plugins/replay_ssm/kernel.py --out /tmp/ab.json
"""

import argparse
import contextlib
import datetime
import hashlib
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # replay_ssm.py and kernel_variants.py, also when loaded by path (tests)
import replay_ssm as RB  # noqa: E402
from kernel_variants import Variant, environment, load_variants  # noqa: E402

from ocria.bench.results import write_json  # noqa: E402
from ocria.bench.timing import copy_bandwidth  # noqa: E402


@contextlib.contextmanager
def active(variant: Variant):
    """``replay_ssm``'s rows run the variant's kernels with its environment; the environment is restored after."""
    with environment(variant.env):
        RB.K = variant.module
        yield


def run_child(cmd: list[str], timeout: float) -> str | None:
    """Run ``cmd``; None when it exits 0, else why not (its last error line, or that it was killed at ``timeout``)."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"no result within {timeout:g} s (killed)"
    if done.returncode == 0:
        return None
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


def check_in_child(spec: str, args: argparse.Namespace) -> dict:
    """One variant's float64 check in a child process (``--check-only``) killed after ``--check-timeout`` seconds:
    its errors by batch, or {"failed": why}."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "check.json"
        cmd = [sys.executable, __file__, "--check-only", "--device", args.device, "--heads", *map(str, args.heads),
               "--check-batches", *map(str, args.check_batches), "--variant", spec, "--out", str(out)]  # fmt: skip
        failed = run_child(cmd, args.check_timeout)
        if failed is not None:
            return {"failed": failed}
        return next(iter(json.loads(out.read_text())["correctness"].values()))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", action="append", required=True, help="name=path[:KEY=value;env.NAME=value;...]")
    p.add_argument("--rows", nargs="+", default=["8x16", "32x16", "64x16"], help="BATCHxT")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--check-batches", nargs="*", type=int, default=[5, 40],
                   help="batch sizes of the float64 check (40 at Qwen3.5 heads is a deep grid)")
    p.add_argument("--heads", nargs=3, type=int, default=[16, 32, 128], metavar=("HK", "HV", "D"))
    p.add_argument("--rotate-mib", type=int, default=1024)
    p.add_argument("--device", default="cuda")
    p.add_argument("--check-timeout", type=float, default=0,
                   help="seconds: check each variant in a child process killed after this long (0: in this one)")
    p.add_argument("--check-only", action="store_true", help=argparse.SUPPRESS)  # what the child runs
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.check_timeout < 0:
        raise SystemExit(f"--check-timeout {args.check_timeout}: use 0 (no child process) or more")
    device = torch.device(args.device)
    rows = RB.parse_rows(args.rows)
    if args.rounds < 1:
        raise SystemExit(f"--rounds {args.rounds}: use at least 1")
    variants = load_variants(args.variant)
    heads = tuple(args.heads)
    result = dict(
        date=str(datetime.date.today()), gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        command="python " + shlex.join([sys.argv[0], *(sys.argv[1:] if argv is None else argv)]),
        torch=torch.__version__,
        variants=[dict(name=v.name, path=v.path, sha256=hashlib.sha256(Path(v.path).read_bytes()).hexdigest(),
                       attrs=v.attrs, env=v.env) for v in variants],
        correctness={}, rows=[],
    )  # fmt: skip
    for v, spec in zip(variants, args.variant):
        if args.check_timeout and not args.check_only:
            result["correctness"][v.name] = check_in_child(spec, args)
            continue
        with active(v):
            result["correctness"][v.name] = {
                str(B): RB.check_correctness(heads, device, {}, steps=4, B=B) for B in args.check_batches
            }
    if args.check_only:
        write_json(result, args.out)
        return
    failed = {name: c["failed"] for name, c in result["correctness"].items() if "failed" in c}
    for name, why in failed.items():
        print(f"{name}: check failed, not timed: {why}", flush=True)
    variants = [v for v in variants if v.name not in failed]
    if not variants:
        write_json(result, args.out)
        raise SystemExit("no variant passed its check; nothing timed (see correctness in the result file)")
    bw = copy_bandwidth() if device.type == "cuda" else 1e12  # CPU: nominal, so the floor arithmetic runs
    result["copy_bandwidth_GBps"] = bw / 1e9
    for r in range(args.rounds):
        for B, T in rows:
            for v in variants:
                with active(v):
                    row = RB.bench_row(B, T, heads, torch.bfloat16, device, bw, {}, None, args.rotate_mib << 20,
                                       baselines=False)  # fmt: skip
                result["rows"].append(dict(row, variant=v.name, round=r))
                print(f"round {r} batch {B:3d} T {T:2d} {v.name:>16}: {row['ours_us']:8.2f} us "
                      f"({row['ours_over_floor']:.3f}x floor)", flush=True)  # fmt: skip
    write_json(result, args.out)
    print(f"\n{'variant':>16} {'B':>3} {'T':>3} {'median us':>10} {'x floor':>8}  worst bf16 output / state error")
    for B, T in rows:
        for v in variants:
            mine = [x for x in result["rows"] if x["variant"] == v.name and (x["batch"], x["T"]) == (B, T)]
            us = statistics.median(x["ours_us"] for x in mine)
            errs = [c["bfloat16"] for c in result["correctness"][v.name].values()]
            worst = f"{max(e['output'] for e in errs):.1e} / {max(e['state'] for e in errs):.1e}" if errs else "-"
            print(f"{v.name:>16} {B:3d} {T:3d} {us:10.2f} {us / mine[0]['floor_us']:8.3f}  {worst}")


if __name__ == "__main__":
    main()
