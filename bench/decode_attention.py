"""Decode attention on the GPU: the one-chunk kernel (one program per row and KV head, the kernel before
split-KV) against split-KV with the chunk count the op picks, and a sweep of chunk counts.

Shapes from the preset (ocria-1-sim): the target's attention at T=1 (ar) and T=16 (verify, causal),
the drafter's at T=16 (bidirectional block). Every row holds ``context`` keys (new tokens included),
bf16 cache. Bytes: K and V of the context, once per KV head. The caches of consecutive calls are
different slots of one cache (>= 96 MB touched per round, past the 50 MB L2) so the keys come from
HBM, as they do in a decode step whose weight reads have flushed L2. Timing: a CUDA graph of those
calls, median over replays / calls (ocria.bench.timing). Each configuration is checked against the
PyTorch reference (bf16 tolerance of the tests).

    python3 bench/decode_attention.py --out bench/results/decode_attention_h200.json
CPU smoke run (Triton interpreter, small contexts, checks only, no timing):
    TRITON_INTERPRET=1 python bench/decode_attention.py --device cpu --context 100 --batch 1 2 --out /tmp/d.json
"""

import argparse
import datetime
import shlex
import sys
import time
from functools import partial

import torch

from ocria.bench.results import write_json
from ocria.bench.timing import finish, rel_err, time_calls
from ocria.builder.presets import load_preset
from ocria.plugins.decode_attention.kernel import (
    BN,
    MAX_SPLITS,
    chunking,
    decode_attention_triton,
    split_count,
)
from ocria.plugins.decode_attention.reference import decode_attention_reference
from ocria.plugins.launch import sm_count

ROTATE_BYTES = 96 << 20
TOLERANCE = 2e-2  # bf16, as tests/test_decode_attention.py
SWEEP = (1, 2, 4, 8, 16, 32, 64)


def shapes(preset: str) -> list[dict]:
    text, drafter = load_preset(preset).target["text_config"], load_preset(preset).drafter
    tgt = {"H": text["num_attention_heads"], "Hkv": text["num_key_value_heads"], "D": text["head_dim"]}
    dft = {"H": drafter["num_attention_heads"], "Hkv": drafter["num_key_value_heads"], "D": drafter["head_dim"]}
    return [{"name": "target_ar", **tgt, "T": 1, "causal": True},
            {"name": "target_verify", **tgt, "T": 16, "causal": True},
            {"name": "drafter_block", **dft, "T": 16, "causal": False}]


def case(shape: dict, B: int, ctx: int, dev: str, timed: bool):
    """q, cache, start and the slot tensors of the rotated calls."""
    H, Hkv, D, T = shape["H"], shape["Hkv"], shape["D"], shape["T"]
    kv_bytes = B * Hkv * ctx * D * 2 * 2
    copies = max(2, min(160, -(-ROTATE_BYTES // kv_bytes))) if timed else 1
    g = torch.Generator(dev).manual_seed(B * ctx + T)
    q = torch.randn(B, T, H, D, generator=g, device=dev).to(torch.bfloat16).transpose(1, 2)
    k = torch.randn(B * copies, Hkv, ctx, D, generator=g, device=dev).to(torch.bfloat16)
    v = torch.randn(B * copies, Hkv, ctx, D, generator=g, device=dev).to(torch.bfloat16)
    start = torch.full((B,), ctx - T, dtype=torch.int32, device=dev)
    slots = [torch.arange(B, device=dev) + i * B for i in range(copies)]
    return q, k, v, start, slots, kv_bytes


def measure(shape: dict, B: int, ctx: int, dev: str, sms: int) -> dict:
    """One configuration: errors against the reference for every chunk count tried, and (on CUDA) µs."""
    timed = dev == "cuda"
    q, k, v, start, slots, kv_bytes = case(shape, B, ctx, dev, timed)
    scale, causal = shape["D"] ** -0.5, shape["causal"]
    auto = chunking(ctx, split_count(B * shape["Hkv"], ctx, sms))[1]
    counts = sorted({chunking(ctx, n)[1] for n in (*SWEEP, auto) if n <= min(MAX_SPLITS, -(-ctx // BN))})
    want = decode_attention_reference(q, k, v, slots[0], start, ctx, scale, causal)
    row = {**shape, "batch": B, "context": ctx, "kv_bytes": kv_bytes, "auto_splits": auto, "max_rel_err": {}}
    us = {}
    for n in counts:
        call = partial(decode_attention_triton, q, k, v, attn_len=ctx, scale=scale, causal_block=causal, num_splits=n)
        row["max_rel_err"][str(n)] = rel_err(call(slots=slots[0], start=start), want)
        if timed:
            us[n] = time_calls([partial(call, slots=s, start=start) for s in slots], len(slots))
    row["ok"] = max(row["max_rel_err"].values()) <= TOLERANCE
    if timed:
        best = min(us, key=us.get)
        row.update(us={str(n): t for n, t in us.items()}, one_split_us=us[1], auto_us=us[auto],
                   speedup=us[1] / us[auto], auto_GBps=kv_bytes / us[auto] * 1e-3, best_splits=best, best_us=us[best])
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="ocria-1-sim")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--context", type=int, nargs="+", default=[300, 4096])
    ap.add_argument("--out", default="bench/results/decode_attention_h200.json")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    t0 = time.time()
    timed = args.device == "cuda"
    sms = sm_count(torch.device(args.device))
    rows = []
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "gpu": torch.cuda.get_device_name() if timed else "cpu (interpreter, untimed)",
              "sms": sms, "torch": torch.__version__, "triton": __import__("triton").__version__,
              "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]), "preset": args.preset,
              "tolerance_bf16": TOLERANCE, "rows": rows}
    print(f"{'shape':14s} {'B':>3} {'ctx':>5} {'auto':>4} {'1-split µs':>10} {'auto µs':>8} {'speedup':>7} "
          f"{'GB/s':>6} {'best':>11} {'err':>8}")
    for shape in shapes(args.preset):
        for ctx in args.context:
            for B in args.batch:
                r = measure(shape, B, ctx, args.device, sms)
                rows.append(r)
                err = max(r["max_rel_err"].values())
                if timed:
                    print(f"{shape['name']:14s} {B:3d} {ctx:5d} {r['auto_splits']:4d} {r['one_split_us']:10.2f} "
                          f"{r['auto_us']:8.2f} {r['speedup']:7.2f} {r['auto_GBps']:6.0f} "
                          f"{r['best_splits']:4d}:{r['best_us']:6.2f} {err:8.1e}", flush=True)
                else:
                    print(f"{shape['name']:14s} {B:3d} {ctx:5d} {r['auto_splits']:4d} checked chunk counts "
                          f"{list(r['max_rel_err'])}: {err:.1e}", flush=True)
                write_json(result, args.out)
    finish(result, rows, t0, args.out)


if __name__ == "__main__":
    main()
