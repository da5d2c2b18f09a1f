"""Where a step of the warp-specialized ReplaySSM kernel spends its time: per-partition clock stamps, one launch.

A probe, GPU only (Gluon has no interpreter). It runs a copy of ``ocria/plugins/replay_ssm/hopper.py`` that takes one
more argument, an int64 buffer of 128 stamps per CTA, and writes ``%clock64`` into it at fixed points (for the
current file ``STAMP_PATCH``, which the test suite checks still applies; an older version of the kernel needs a stamp
patch made for that version):
consumer c (base 40 c): start, first inputs issued, per tile (up to 6) its start, its first chunk's arrival, the end of
its chunk loop, the prep's matrices ready, the tile's end, and the partition's end; loader c (base 80 + 8 c): start,
first, 4th, 5th and 9th TMA copy issued, end; prep (base 96): start, per group (up to 4) its matrices published and its
keys and queries landed, end; consumer 0 also writes ``%globaltimer`` at its start and end (126, 127) with the clocks
beside them (124, 125), which turn cycles into µs. Stamps 106-123 are a probe's own (``SPARE``): whatever a scratch
copy writes there is reported by index. Times are µs from the CTA's first stamp, medians over CTAs.

    cp ocria/plugins/replay_ssm/hopper.py /tmp/hopper_tl.py
    patch /tmp/hopper_tl.py STAMP_PATCH  # the file the constant below names
    python bench/replay_ssm_timeline.py --hopper /tmp/hopper_tl.py --batch 8 16 32 64 --out /tmp/timeline.json
"""

import argparse
import datetime
import shlex
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import replay_ssm as RB  # noqa: E402
from kernel_variants import Variant, load  # noqa: E402

from ocria.bench.results import write_json  # noqa: E402
from ocria.plugins.launch import sm_count  # noqa: E402
from ocria.plugins.replay_ssm import kernel as K  # noqa: E402

# The stamps for the current ocria/plugins/replay_ssm/hopper.py, as a patch of it.
STAMP_PATCH = "bench/results/replay_ssm_s36_timeline.patch"
# Stamps no patch of ours writes: a probe's own (written as ``stamp_ptr + first * 128 + i``) come back by index.
SPARE = range(106, 124)
HEADS = (16, 32, 128)  # Hk, Hv, Dk = Dv: Qwen3.5's GDN layers
TMAX = T = 16


def cta_times(s: list[int]) -> dict:
    """One CTA's stamps as µs from its first stamp (None where a stamp was not written)."""
    per_ns = (s[125] - s[124]) / max(1, s[127] - s[126])
    t0 = min(x for x in (s[0], s[40], s[80], s[88], s[96]) if x)

    def us(x):
        return round((x - t0) / per_ns / 1e3, 3) if x else None

    cta = dict(gt_start=s[126], gt_end=s[127], ghz=per_ns)
    for c in (0, 1):
        b = 40 * c
        cta[f"c{c}"] = dict(start=us(s[b]), inputs=us(s[b + 1]), end=us(s[b + 38]),
                            tiles=[[us(s[b + 2 + 6 * t + j]) for j in range(5)] for t in range(6) if s[b + 2 + 6 * t]])
        cta[f"l{c}"] = [us(s[80 + 8 * c + j]) for j in range(6)]
    cta["prep"] = dict(start=us(s[96]), publish=[us(s[97 + j]) for j in range(4)],
                       loaded=[us(s[101 + j]) for j in range(4)], end=us(s[105]))
    cta["spare"] = {i: us(s[i]) for i in SPARE if s[i]}
    return cta


def run(H, B: int, device: torch.device) -> dict:
    Hk, Hv, D = HEADS
    gen = torch.Generator(device=device).manual_seed(B)
    reps = max(2, 256 // B)  # rotating slot sets, as bench/replay_ssm.py times them
    bufs, _ = RB.make_buffers(reps * B, Hk, Hv, D, D, TMAX, 2 * Hk * D + Hv * D, 4, device, gen,
                              torch.full((reps * B,), T))  # fmt: skip
    inp, _ = RB.make_inputs(B, T, Hk, Hv, D, D, 2 * Hk * D + Hv * D, torch.bfloat16, device, gen)
    rows = [K.token_rows(inp[n]) for n in ("q", "k", "v", "a", "b")]
    q, k, v, a, b = (t for t, _ in rows)
    sets = [torch.randperm(B, device=device, generator=gen).int() + r * B for r in range(reps)]
    o = torch.empty_like(inp["v"])
    programs = min(B * Hk, sm_count(device))  # ws_verify's grid: one CTA per SM at most
    stamps = torch.zeros(programs * 128, dtype=torch.int64, device=device)
    for s in sets + sets:  # warm-up, then the round whose last launch is read
        H.ws_verify(q, k, v, a, b, inp["A_log"], inp["dt_bias"], bufs["state"], bufs["ring_k"], bufs["ring_u"],
                    bufs["ring_g"], bufs["ring_phase"], bufs["pending_len"], s, o, T, tuple(s_ for _, s_ in rows),
                    stamps)  # fmt: skip
    torch.cuda.synchronize()
    ctas = [cta_times(row) for row in stamps.view(programs, 128).cpu().tolist()]
    start = min(c["gt_start"] for c in ctas)
    return dict(batch=B, T=T, span_us=(max(c["gt_end"] for c in ctas) - start) / 1e3, ctas=ctas)


def median(values) -> float | None:
    values = [x for x in values if x is not None]
    return round(statistics.median(values), 2) if values else None


def summary(row: dict) -> None:
    ctas = row["ctas"]
    print(f"batch {row['batch']}: span {row['span_us']:.2f} us (first CTA start to last consumer end)")
    for c in (0, 1):
        part = [x[f"c{c}"] for x in ctas]
        print(f"  consumer {c}: inputs {median(p['inputs'] for p in part)}, end {median(p['end'] for p in part)}")
        for t in range(min(len(p["tiles"]) for p in part)):
            print(f"    tile {t} start / data / chunks done / prep ready / end:",
                  [median(p["tiles"][t][j] for p in part) for j in range(5)])
    prep = [x["prep"] for x in ctas]
    print("  prep: keys landed", [median(p["loaded"][j] for p in prep) for j in range(4)],
          "published", [median(p["publish"][j] for p in prep) for j in range(4)])
    spare = sorted({i for x in ctas for i in x["spare"]})
    if spare:
        print("  spare stamps:", {i: median(x["spare"].get(i) for x in ctas) for i in spare})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hopper", required=True, help="a stamped copy of hopper.py (see the module docstring)")
    p.add_argument("--batch", type=int, nargs="+", default=[8, 16, 32, 64])
    p.add_argument("--out", required=True)
    args = p.parse_args()
    if not Path(args.hopper).is_file():
        raise SystemExit(f"--hopper {args.hopper}: no such file (a copy of hopper.py with {STAMP_PATCH} applied)")
    if not torch.cuda.is_available():
        raise SystemExit("replay_ssm_timeline: needs a CUDA GPU (Hopper), none is visible")
    device = torch.device("cuda")
    stamped = Variant("stamped", args.hopper)
    load(stamped)  # a copy that does not import is named, not traced back
    H = stamped.module
    result = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(),
                  command="python " + shlex.join(sys.argv), rows=[])  # fmt: skip
    for B in args.batch:
        result["rows"].append(run(H, B, device))
        summary(result["rows"][-1])
        write_json(result, args.out)


if __name__ == "__main__":
    main()
