"""Batch invariance on the GPU, plugin by plugin: a row's bits inside a batch-invariant step do not depend on
how many rows share the launch, and what the invariant choice costs against the per-shape one.

For each decode GEMM shape of the preset (bf16 and FP8 weights, and NVFP4 for the MLP), 512 rows (32 sequences
x 16-token blocks) against the same rows in 1- and 16-row calls; attention of 32 sequences x 16 tokens against
each token alone with its own length bound; ReplaySSM verify blocks against one-token steps after the same
accepted tokens (outputs and the folded state). Then each op's time (CUDA graphs, median) with invariance on and
off at the row counts of batch 1, 8 and 32 (x 16 tokens), and the decode GEMM's other forms (``VARIANTS``).

    python bench/invariance.py --out bench/results/invariance_h200.json
"""

import argparse
import datetime as dt
import json
import sys

import torch
from decode_gemm import shapes
from triton.runtime.errors import OutOfResources

from ocria.bench.timing import time_calls
from ocria.plugins import numerics as nx
from ocria.plugins.decode_attention import decode_attention
from ocria.plugins.decode_gemm import decode_gemm, decode_gemm_fp8, decode_gemm_fp8_triton, decode_gemm_triton
from ocria.plugins.decode_gemm.kernel import default_config
from ocria.plugins.fp4_gemm import nvfp4_gemm
from ocria.plugins.replay_ssm.kernel import replay_verify_kernel
from ocria.plugins.replay_ssm.ops import replay_verify
from ocria.plugins.switch import batch_invariant_rows

BLOCK = 16
SEQUENTIAL_TILES = ((16, 1), (16, 2), (32, 2), (32, 4))  # (block_v, num_warps) besides the default 16 x 4
BATCHES = (1, 8, 32)
SAMPLE_ROWS = (0, 17, 255, 511)


def _invariant(fn):
    """``fn`` run inside ``batch_invariant_rows()`` (also when a CUDA graph captures it)."""
    def call(*args, **kwargs):
        with batch_invariant_rows():
            return fn(*args, **kwargs)
    return call


def _rows(inp, rows: slice):
    """Rows of an op's input: a tensor, or a tuple of row-indexed tensors (FP8 bytes and their scales)."""
    return tuple(t[rows] for t in inp) if isinstance(inp, tuple) else inp[rows]


def _call(op, inp):
    return op(*inp) if isinstance(inp, tuple) else op(inp)


def _rows_equal(op, inp, alone_op=None) -> bool:
    """Rows of ``op`` over 512 rows equal to the same rows computed alone (``alone_op``, default ``op``) and in the
    first 16-row call."""
    alone_op = _invariant(alone_op or op)
    full = _call(_invariant(op), inp)
    alone = all(torch.equal(_call(alone_op, _rows(inp, slice(m, m + 1)))[0], full[m]) for m in SAMPLE_ROWS)
    return alone and torch.equal(_call(alone_op, _rows(inp, slice(0, BLOCK))), full[:BLOCK])


def _times(ops: dict, inp) -> dict:
    """µs per call at batch B x 16 rows of each op (invariant ones inside ``batch_invariant_rows()``)."""
    out = {}
    for B in BATCHES:
        part = _rows(inp, slice(0, B * BLOCK))
        out[B] = {name: time_calls([lambda p=part, op=op: _call(op, p)]) for name, op in ops.items()}
    return out


# Other decode-GEMM forms for rows beyond 16, against the default (``MAX_ROW_TILES`` 16-row tiles per program):
# fewer tiles per program, and one wide tile (``block_m`` 64 or 128: one MMA over more rows, not several 16-row
# ones), whose bits decide whether it may serve batch-invariant steps.
VARIANTS = {"row_tiles1": {"row_tiles": 1}, "row_tiles2": {"row_tiles": 2},
            "block_m64": {"block_m": 64, "row_tiles": 1, "num_stages": 2},
            "block_m128": {"block_m": 128, "row_tiles": 1, "num_stages": 2}}


def gemm_rows(preset: str) -> list[dict]:
    """Each shape in bf16 and FP8 (and NVFP4 for the MLP): the invariant op's rows against rows alone, times with
    invariance on and off, and each of ``VARIANTS``' bits and times."""
    g = torch.Generator(device="cuda").manual_seed(0)
    out = []
    for s in shapes(preset, 1):
        N, K = s["N"], s["K"]
        x = torch.randn(BATCHES[-1] * BLOCK, K, device="cuda", generator=g).to(torch.bfloat16)
        w = (torch.randn(N, K, device="cuda", generator=g) * K**-0.5).to(torch.bfloat16)
        w_scale = w.float().abs().amax() / 448
        w8, (q8, s8) = nx.quantize_fp8(w, w_scale), nx.quantize_fp8_per_token(x)
        cfg = default_config(N, K)
        configs = {name: dict(cfg, **v) for name, v in VARIANTS.items()}
        cases = {"bf16": (x, lambda a, w=w: decode_gemm(a, w),
                          {n: lambda a, w=w, c=c: decode_gemm_triton(a, w, config=c) for n, c in configs.items()}),
                 "fp8": ((q8, s8), lambda q, sx, w8=w8, ws=w_scale: _fp8(q, sx, w8, ws),
                         {n: lambda q, sx, w8=w8, ws=w_scale, c=c: decode_gemm_fp8_triton(q, w8, sx, ws, config=c)
                          for n, c in configs.items()})}  # fmt: skip
        if s["name"].startswith("mlp"):
            gs = nx.nvfp4_global_scale(w.float().abs().amax()).cuda()
            packed, scales = nx.quantize_nvfp4(w, gs)
            cases["nvfp4"] = (x, lambda a, p=packed, sc=scales, gs=gs: nvfp4_gemm(a, p, sc, gs), {})
        for fmt, (inp, op, variants) in cases.items():
            row = {"op": f"{s['name']} {fmt}", "N": N, "K": K, "config": cfg, "bit_identical": _rows_equal(op, inp)}
            ops = {"invariant_us": _invariant(op), "default_us": op}
            for name, variant in variants.items():
                try:
                    row[f"{name}_bit_identical"] = _rows_equal(variant, inp, alone_op=op)
                except OutOfResources as e:  # a tile this GPU cannot hold: reported, not timed
                    row[f"{name}_bit_identical"] = f"not run: {e}"
                    continue
                ops[f"{name}_us"] = variant
            row["times"] = _times(ops, inp)
            out.append(row)
            print(_line(row), flush=True)
    return out


def _fp8(q: torch.Tensor, sx: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """An FP8 layer on per-token quantized rows: the decode GEMM, else ``_scaled_mm`` (as ``QuantLinear``)."""
    y = decode_gemm_fp8(q, w8, sx, w_scale)
    if y is None:
        y = torch._scaled_mm(q, w8.t(), scale_a=sx, scale_b=w_scale.expand(1, w8.shape[0]).contiguous(),
                             out_dtype=torch.bfloat16)
    return y


def attention_row(preset_cfg: dict, context: int = 300) -> dict:
    H, Hkv, D = preset_cfg["num_attention_heads"], preset_cfg["num_key_value_heads"], preset_cfg["head_dim"]
    B = BATCHES[-1]
    g = torch.Generator(device="cuda").manual_seed(1)
    k = torch.randn(B, Hkv, context + 64, D, device="cuda", generator=g).to(torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(B, BLOCK, H, D, device="cuda", generator=g).to(torch.bfloat16).transpose(1, 2)
    slots = torch.arange(B, device="cuda")
    start = torch.randint(context // 2, context, (B,), device="cuda", generator=g, dtype=torch.int32)
    attn_len = context + BLOCK
    op = _invariant(decode_attention)
    block = op(q, k, v, slots, start, attn_len, D**-0.5)
    same = all(torch.equal(op(q[b:b + 1, :, t:t + 1], k, v, slots[b:b + 1], start[b:b + 1] + t,
                              int(start[b]) + t + 1, D**-0.5)[0, :, 0], block[b, :, t])
               for b in (0, B - 1) for t in (0, 7, 15))  # fmt: skip
    times = {}
    for nb in BATCHES:
        args = (q[:nb], k, v, slots[:nb], start[:nb], attn_len, D**-0.5)
        times[nb] = {"invariant_us": time_calls([lambda a=args: op(*a)]),
                     "default_us": time_calls([lambda a=args: decode_attention(*a)])}  # fmt: skip
    row = {"op": f"attention ctx {context}", "bit_identical": same, "times": times}
    print(_line(row), flush=True)
    return row


def replay_row(cfg: dict) -> dict:
    Hk, Hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    Dk, Dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    B = BATCHES[-1]
    g = torch.Generator(device="cuda").manual_seed(2)

    def r(*s):
        return torch.randn(*s, device="cuda", generator=g)

    q, k, v = r(B, BLOCK, Hk, Dk).bfloat16(), r(B, BLOCK, Hk, Dk).bfloat16(), r(B, BLOCK, Hv, Dv).bfloat16()
    a, b = r(B, BLOCK, Hv).bfloat16(), r(B, BLOCK, Hv).bfloat16()
    A_log, dt_bias, state0 = r(Hv) - 2, r(Hv), r(B, Hv, Dk, Dv) * 0.1
    slots = torch.arange(B, device="cuda")

    def fresh():
        z = torch.zeros
        return [state0.clone(), z(B, 2, BLOCK, Hk, Dk, device="cuda"), z(B, 2, BLOCK, Hv, Dv, device="cuda"),
                z(B, 2, BLOCK, Hv, device="cuda"), z(B, dtype=torch.int32, device="cuda"),
                z(B, dtype=torch.int32, device="cuda")]

    def step(buf, t0, t1, accepted):
        o = _invariant(replay_verify)(q[:, t0:t1], k[:, t0:t1], v[:, t0:t1], a[:, t0:t1], b[:, t0:t1], A_log,
                                      dt_bias, *buf, slots)  # fmt: skip
        buf[4] ^= 1
        buf[5][:] = accepted
        return o

    blocked, alone = fresh(), fresh()
    block = step(blocked, 0, BLOCK, 11)  # 11 of 16 accepted, then one more token each
    ones = torch.cat([step(alone, t, t + 1, 1) for t in range(11)], 1)
    same = torch.equal(ones, block[:, :11])
    same &= torch.equal(step(blocked, 11, 12, 1), step(alone, 11, 12, 1)) and torch.equal(blocked[0], alone[0])
    times = {}
    for nb in BATCHES:
        for T in (1, BLOCK):
            buf = fresh()
            args = (q[:nb, :T], k[:nb, :T], v[:nb, :T], a[:nb, :T], b[:nb, :T], A_log, dt_bias, *buf, slots[:nb])
            times[f"{nb}x{T}"] = {"invariant_us": time_calls([lambda x=args: _invariant(replay_verify)(*x)]),
                                  "default_us": time_calls([lambda x=args: replay_verify(*x)])}
            for bv, warps in SEQUENTIAL_TILES:  # the sequential kernel's other tiles (each one for every T and B)
                times[f"{nb}x{T}"][f"bv{bv}_w{warps}_us"] = time_calls(
                    [lambda x=args, bv=bv, w=warps: _invariant(replay_verify_kernel)(*x, block_v=bv, num_warps=w)])
    row = {"op": "replay_verify", "bit_identical": bool(same), "times": times}
    print(_line(row), flush=True)
    return row


def _line(row: dict) -> str:
    bits = "".join("1" if row[k] is True else "0" for k in row if k.endswith("_bit_identical"))
    t = " | ".join(f"{k}: " + "/".join(f"{us:.1f}" for us in v.values()) for k, v in row["times"].items())
    return f"{row['op']:<20} {str(row['bit_identical']):<5} {bits:<4} us {t}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="ocria-1-sim")
    ap.add_argument("--out", default="bench/results/invariance_h200.json")
    ops = ("gemm", "attention", "replay")
    ap.add_argument("--ops", nargs="+", choices=ops, default=list(ops))
    args = ap.parse_args()
    from ocria.builder.presets import load_preset

    cfg = load_preset(args.preset).target["text_config"]
    print(f"op                   bits (variants: {', '.join(VARIANTS)}) us per batch (x16 rows): invariant/default/"
          "variants")
    rows = ((gemm_rows(args.preset) if "gemm" in args.ops else []) + ([attention_row(cfg)] if "attention" in args.ops
            else []) + ([replay_row(cfg)] if "replay" in args.ops else []))  # fmt: skip
    result = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "gpu": torch.cuda.get_device_name(), "command": " ".join(["python", *sys.argv]),
              "torch": torch.__version__, "preset": args.preset, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0 if all(r["bit_identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
