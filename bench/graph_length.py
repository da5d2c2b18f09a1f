"""What the length of a timed CUDA graph does to µs per call: the NVFP4 SiLU-quant kernel and a copy of its bytes.

``timing.time_calls`` divides a replay's time by its calls, so the replay's own launch is spread over them. This
times the same closures in graphs of fixed lengths (``min_graph_us=0``) and with time_calls' default (graphs of at
least ``timing.GRAPH_US``), interleaved in rounds, and reports medians against the bytes floor.

    python3 bench/graph_length.py --out bench/results/graph_length_h200.json
"""

import argparse
import datetime
import shlex
import statistics
import sys

import torch
from silu_quant import ROTATE_BYTES, out_bytes

from ocria.bench.results import write_json
from ocria.bench.timing import GRAPH_US, copy_bandwidth, time_calls
from ocria.plugins import numerics as nx
from ocria.plugins.silu_quant.kernel import silu_mul_quant_triton


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--width", type=int, default=6144)
    ap.add_argument("--calls", type=int, nargs="+", default=[20, 110, 440], help="fixed graph lengths to time")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="bench/results/graph_length_h200.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("times CUDA graphs; no CUDA device is visible")
    m, n = args.tokens, args.width
    torch.manual_seed(0)
    scale = nx.nvfp4_global_scale(torch.tensor(12.0)).cuda()
    copies = max(1, min(64, -(-ROTATE_BYTES // (m * 4 * n))))
    xs = [(torch.randn(m, 2 * n, device="cuda") * 3).to(torch.bfloat16) for _ in range(copies)]
    nbytes = m * 4 * n + out_bytes(m, n, "nvfp4")
    src = [torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda").random_() for _ in range(copies)]
    dst = [torch.empty_like(s) for s in src]
    closures = {"nvfp4": [lambda x=x: silu_mul_quant_triton(x, "nvfp4", scale) for x in xs],
                "copy": [lambda s=s, d=d: d.copy_(s) for s, d in zip(src, dst)]}
    bw = copy_bandwidth()
    floor = nbytes / bw * 1e6
    lengths = [(f"{c}_calls", c, 0.0) for c in args.calls] + [(f"default_{GRAPH_US:.0f}us", 20, GRAPH_US)]
    times = {(what, name): [] for what in closures for name, _, _ in lengths}
    for _ in range(args.rounds):
        for what, fns in closures.items():
            for name, calls, graph_us in lengths:
                times[what, name].append(time_calls(fns, calls, min_graph_us=graph_us))
    rows = []
    print(f"{m} x {n}, copy bandwidth {bw / 1e12:.3f} TB/s, floor {floor:.3f} µs")
    print(f"{'graph':>14} " + " ".join(f"{w:>18}" for w in closures))
    for name, calls, graph_us in lengths:
        row = {"graph": name, "min_calls": calls, "min_graph_us": graph_us}
        for what in closures:
            us = times[what, name]
            row[what] = {"us": us, "median_us": statistics.median(us), "x_floor": statistics.median(us) / floor}
        rows.append(row)
        print(f"{name:>14} " + " ".join(
            f"{row[w]['median_us']:9.3f} ({row[w]['x_floor']:.3f}x)" for w in closures))
    write_json({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "gpu": torch.cuda.get_device_name(),
               "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
               "tokens": m, "width": n, "copies": copies, "bytes": nbytes, "copy_bandwidth_TBps": bw / 1e12,
               "floor_us": floor, "rows": rows}, args.out)


if __name__ == "__main__":
    main()
