"""A/B of SiLU-quant kernel variants in one device call: each checked byte for byte, then timed in interleaved rounds.

A variant is a copy of ``ocria/plugins/silu_quant/kernel.py`` (the committed file, or one a patch from
``bench/results`` was applied to) with module attributes and environment variables of its own,
``name=path[:KEY=value;env.NAME=value]`` as in bench/replay_ssm_ab.py (``bench/kernel_variants.py``). Each variant
first runs bench/silu_quant.py's correctness inputs (every bf16 gate and up value, random rows with NaN/inf/zero
blocks, E2M1 ties, every bf16 value as the activation under several scales) against the PyTorch reference; a variant
with a mismatching byte is not timed. Rows (tokens x width) are then timed like bench/silu_quant.py's table (a CUDA
graph over rotating input copies and outputs, the kernel's default config), variants interleaved round by round, and
reported against the bytes floor. ``--time-inexact`` times variants with mismatching bytes too: probes that leave work
out on purpose (an instruction replaced by a move, say) to see what that work costs. ``--pooled-outputs`` times the
older way, every call writing the same output buffers (they stay in L2 between calls, so their write-back is not paid).

    git show HEAD:ocria/plugins/silu_quant/kernel.py > /tmp/head.py
    python bench/silu_quant_ab.py --variant head=/tmp/head.py --variant new=ocria/plugins/silu_quant/kernel.py \
        --mode nvfp4 --rows 1024x6144 1024x12288 4096x12288 --rounds 3 --out bench/results/silu_quant_ab.json
"""

import argparse
import datetime
import shlex
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # silu_quant.py and kernel_variants.py, also when loaded by path (tests)
import silu_quant as SQ  # noqa: E402
from kernel_variants import environment, load_variants  # noqa: E402

from ocria.bench.results import write_json  # noqa: E402
from ocria.bench.timing import copy_bandwidth, rotating_calls, time_calls  # noqa: E402
from ocria.plugins import numerics as nx  # noqa: E402


def parse_rows(specs: list[str]) -> list[tuple[int, int]]:
    """``MxN`` tokens x width, N a multiple of 16."""
    rows = []
    for spec in specs:
        m, sep, n = spec.partition("x")
        if not (sep and m.isdigit() and n.isdigit()) or int(m) < 1 or int(n) % 16:
            raise SystemExit(f"--rows {spec!r}: use TOKENSxWIDTH with a width that is a multiple of 16")
        rows.append((int(m), int(n)))
    return rows


def timed_variants(variants: list, checks: dict, time_inexact: bool) -> list:
    """The variants to time: the byte-exact ones, or all of them for probes (``--time-inexact``)."""
    inexact = [v.name for v in variants if any(c["mismatches"] for c in checks[v.name])]
    if inexact and time_inexact:
        print(f"timed although their bytes differ (probes): {', '.join(inexact)}")
    return [v for v in variants if time_inexact or v.name not in inexact]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", action="append", required=True,
                    help="name=path[:KEY=value;env.NAME=value;...] of a kernel.py copy")
    ap.add_argument("--mode", choices=SQ.MODES, default="nvfp4")
    ap.add_argument("--rows", nargs="+", default=["1024x6144", "1024x12288", "1024x18944", "4096x12288"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--time-inexact", action="store_true",
                    help="time variants whose bytes differ too (probes that leave work out)")
    ap.add_argument("--pooled-outputs", action="store_true",
                    help="let the graph's pool give every call the same outputs, as older timings did (in L2)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    variants = load_variants(args.variant)
    rows = parse_rows(args.rows)
    if not torch.cuda.is_available():
        raise SystemExit("silu_quant_ab.py times kernels on a CUDA device; none is visible")
    torch.manual_seed(0)
    scales = {"bf16": None, "fp8_static": torch.tensor([0.02], device="cuda"), "fp8_dynamic": None,
              "nvfp4": nx.nvfp4_global_scale(torch.tensor(12.0)).to("cuda")}
    checks = {}
    for v in variants:
        with environment(v.env):
            checks[v.name] = SQ.correctness(scales, "cuda", v.module)
        bad = sum(c["mismatches"] for c in checks[v.name])
        print(f"{v.name}: {v.path}, {bad} mismatching bytes over {len(checks[v.name])} checks")
    timed = timed_variants(variants, checks, args.time_inexact)
    bw = copy_bandwidth()
    times: dict[str, dict[str, list[float]]] = {v.name: {} for v in timed}
    s = scales[args.mode]
    for m, n in rows:
        copies = max(1, min(64, -(-SQ.ROTATE_BYTES // (m * 4 * n))))
        xs = [(torch.randn(m, 2 * n, device="cuda") * 3).to(torch.bfloat16) for _ in range(copies)]
        for _ in range(args.rounds):
            for v in timed:
                call = lambda x, K=v.module: K.silu_mul_quant_triton(x, args.mode, s)  # noqa: E731
                fns = [lambda x=x, f=call: f(x) for x in xs] if args.pooled_outputs else rotating_calls(call, xs)
                with environment(v.env):
                    times[v.name].setdefault(f"{m}x{n}", []).append(time_calls(fns, 20))
        del xs
    table = []
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    names = [v.name for v in timed]
    print(f"{'row':>12} {'floor µs':>9} " + " ".join(f"{n:>16}" for n in names))
    for m, n in rows:
        key = f"{m}x{n}"
        floor = (m * 2 * n * 2 + SQ.out_bytes(m, n, args.mode)) / bw * 1e6
        row = {"row": key, "floor_us": floor}
        for name in names:
            med = statistics.median(times[name][key])
            row[name] = {"us": times[name][key], "median_us": med, "x_floor": med / floor}
        table.append(row)
        print(f"{key:>12} {floor:9.2f} " + " ".join(
            f"{row[nm]['median_us']:8.2f} ({row[nm]['x_floor']:.2f}x)" for nm in names))
    write_json({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "gpu": torch.cuda.get_device_name(), "triton": __import__("triton").__version__,
               "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]), "mode": args.mode,
               "pooled_outputs": args.pooled_outputs, "copy_bandwidth_TBps": bw / 1e12,
               "variants": {v.name: v.path for v in variants},
               "settings": {v.name: {"attrs": v.attrs, "env": v.env} for v in variants if v.attrs or v.env},
               "correctness": checks, "rows": table},
              args.out)


if __name__ == "__main__":
    main()
