"""Decode GEMM on the GPU: the one-launch skinny-GEMM kernel (ocria::decode_gemm) against ``F.linear``
(cuBLAS) for the linears of a preset's decode step, at M = 1, 4 and 16 rows, for a small fixed set of
kernel configurations (the best per shape reported; not an autotuner).

Shapes (ocria-1-sim): GDN fused in_proj (qkv + z + b + a), attention fused q(+gate)/k/v, GDN out_proj,
attention o_proj, MLP fused gate_up, down_proj, lm_head. Bytes: the bf16 weight plus x and the output.
The weights of consecutive calls are different copies (>= 256 MB per round, past the 50 MB L2), so they
come from HBM as in a decode step. Timing: a CUDA graph of those calls, median over replays / calls
(ocria.bench.timing); the fraction is of the device copy bandwidth measured in the same run (2 GiB
``copy_``, read + write). Checks, for every configuration: rows bit-identical across M (row m alone,
in the first 4 rows, in 16 rows) and the error against the fp32 product rounded once (bf16 tolerance; ulp counts
recorded, cuBLAS's too).
``step`` sums count x µs over the step's linears with one configuration per shape (the one fastest over
the three M, since the kernel's configuration must not depend on M).

    python3 bench/decode_gemm.py --out bench/results/decode_gemm_h200.json
CPU smoke run (Triton interpreter, shapes shrunk 64x, checks only, no timing):
    TRITON_INTERPRET=1 python bench/decode_gemm.py --device cpu --shrink 64 --out /tmp/g.json
"""

import argparse
import datetime
import shlex
import sys
import time
from functools import partial

import torch
import torch.nn.functional as F

from ocria.bench.results import write_json
from ocria.bench.timing import copy_bandwidth, finish, rel_err, time_calls
from ocria.builder.presets import load_preset
from ocria.plugins.decode_gemm import decode_gemm_fp32, decode_gemm_triton, default_config

ROTATE_BYTES = 256 << 20
ROWS = (1, 4, 16)
TOLERANCE = 1e-2  # max error / max |output|, bf16 (tests/test_decode_gemm.py)
CONFIGS = {
    "n16_k256_w4_s4": {"block_n": 16, "block_k": 256, "num_warps": 4, "num_stages": 4, "swap": False},
    "n16_k512_w4_s3": {"block_n": 16, "block_k": 512, "num_warps": 4, "num_stages": 3, "swap": False},
    "n32_k256_w4_s4_swap": {"block_n": 32, "block_k": 256, "num_warps": 4, "num_stages": 4, "swap": True},
    "n64_k128_w4_s4_swap": {"block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 4, "swap": True},
    # split-K for the narrow outputs (gdn_out_proj, attn_o_proj, mlp_down: 128 column tiles of 16 at N = 2048)
    "n16_k512_w4_s3_split2": {"block_n": 16, "block_k": 512, "num_warps": 4, "num_stages": 3, "swap": False,
                              "split_k": 2},
    "n16_k256_w4_s4_split4": {"block_n": 16, "block_k": 256, "num_warps": 4, "num_stages": 4, "swap": False,
                              "split_k": 4},
    "n32_k256_w4_s4_swap_split4": {"block_n": 32, "block_k": 256, "num_warps": 4, "num_stages": 4, "swap": True,
                                   "split_k": 4},
    # and for attn_qkv (N = 5120: 80 tiles of 64 columns)
    "n64_k128_w4_s4_swap_split2": {"block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 4, "swap": True,
                                   "split_k": 2},
}


def shapes(preset: str, shrink: int) -> list[dict]:
    """(name, N, K, linears of this shape per decode step) of the preset's target text model."""
    t = load_preset(preset).target["text_config"]
    h, layers = t["hidden_size"], t["num_hidden_layers"]
    attn = layers // t["full_attention_interval"]
    gdn = layers - attn
    hk, hv = t["linear_num_key_heads"], t["linear_num_value_heads"]
    dk, dv = t["linear_key_head_dim"], t["linear_value_head_dim"]
    qo = t["num_attention_heads"] * t["head_dim"]
    kv = t["num_key_value_heads"] * t["head_dim"]
    rows = [("gdn_in_proj", 2 * hk * dk + 2 * hv * dv + 2 * hv, h, gdn),  # qkv, z, b, a fused
            ("attn_qkv", 2 * qo + 2 * kv, h, attn),  # q with its output gate, k, v fused
            ("gdn_out_proj", h, hv * dv, gdn),
            ("attn_o_proj", h, qo, attn),
            ("mlp_gate_up", 2 * t["intermediate_size"], h, layers),
            ("mlp_down", h, t["intermediate_size"], layers),
            ("lm_head", t["vocab_size"], h, 1)]
    return [{"name": n, "N": _shrunk(N, shrink), "K": _shrunk(K, shrink), "per_step": c} for n, N, K, c in rows]


def _shrunk(v: int, shrink: int) -> int:
    """v / shrink, kept a multiple of 16 (the kernel's contract)."""
    return max(16, v // shrink // 16 * 16)


def ulp_stats(got: torch.Tensor, want: torch.Tensor) -> tuple[int, float]:
    """(max bf16 ulp distance, fraction of elements off) between two bf16 tensors."""
    d = (got.view(torch.int16).int() - want.view(torch.int16).int()).abs()
    return int(d.max()), float((d > 0).float().mean())


def accuracy(got: torch.Tensor, want: torch.Tensor) -> dict:
    """Against the fp32 product rounded once: ulp statistics (outputs near 0 can be several ulps off
    after fp32 sums in another order) and the max error relative to the largest output."""
    max_ulp, frac = ulp_stats(got, want)
    return {"max_ulp_vs_fp32": max_ulp, "frac_off_vs_fp32": frac, "max_rel_err": rel_err(got, want)}


def check(x: torch.Tensor, w: torch.Tensor, want: torch.Tensor, cfg: dict) -> dict:
    """Batch invariance and accuracy of one configuration on x [16, K]."""
    full = decode_gemm_triton(x, w, config=cfg)
    four = decode_gemm_triton(x[:4], w, config=cfg)
    alone = [torch.equal(decode_gemm_triton(x[m:m + 1], w, config=cfg)[0], full[m]) for m in (0, 5, 15)]
    return {"bit_equal_across_M": bool(torch.equal(four, full[:4]) and all(alone)), **accuracy(full, want)}


def measure(shape: dict, dev: str, bw: float) -> dict:
    N, K = shape["N"], shape["K"]
    timed = dev == "cuda"
    g = torch.Generator(dev).manual_seed(N + K)
    w0 = (torch.randn(N, K, generator=g, device=dev) * K**-0.5).to(torch.bfloat16)
    x16 = torch.randn(16, K, generator=g, device=dev).to(torch.bfloat16)
    w_bytes = N * K * 2
    row = {**shape, "weight_bytes": w_bytes, "default_config": default_config(N, K), "checks": {}}
    want = decode_gemm_fp32(x16, w0)
    for name, cfg in CONFIGS.items():
        row["checks"][name] = check(x16, w0, want, cfg)
    row["cublas_vs_fp32"] = accuracy(F.linear(x16, w0), want)
    row["ok"] = all(c["bit_equal_across_M"] and c["max_rel_err"] <= TOLERANCE for c in row["checks"].values())
    if not timed:
        return row
    copies = max(1, min(64, -(-ROTATE_BYTES // w_bytes)))
    ws = [w0] + [w0.clone() for _ in range(copies - 1)]
    row["copies"] = copies
    row["by_M"] = {}
    for M in ROWS:
        x = x16[:M]
        nbytes = w_bytes + 2 * M * (K + N)
        us = {"cublas": time_calls([partial(F.linear, x, w) for w in ws], max(20, copies))}
        for name, cfg in CONFIGS.items():
            us[name] = time_calls([partial(decode_gemm_triton, x, w, None, cfg) for w in ws], max(20, copies))
        best = min(CONFIGS, key=us.get)
        row["by_M"][str(M)] = {"bytes": nbytes, "us": us, "best": best, "best_us": us[best],
                               "best_GBps": nbytes / us[best] * 1e-3, "best_frac": nbytes / us[best] * 1e6 / bw,
                               "cublas_GBps": nbytes / us["cublas"] * 1e-3,
                               "cublas_frac": nbytes / us["cublas"] * 1e6 / bw, "speedup": us["cublas"] / us[best]}
    row["best_over_M"] = min(CONFIGS, key=lambda c: sum(row["by_M"][str(M)]["us"][c] for M in ROWS))
    del ws
    torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="ocria-1-sim")
    ap.add_argument("--shrink", type=int, default=1, help="divide N and K (CPU smoke runs)")
    ap.add_argument("--out", default="bench/results/decode_gemm_h200.json")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    t0 = time.time()
    timed = args.device == "cuda"
    bw = copy_bandwidth() if timed else 0.0
    rows = []
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "gpu": torch.cuda.get_device_name() if timed else "cpu (interpreter, untimed)",
              "torch": torch.__version__, "triton": __import__("triton").__version__,
              "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]), "preset": args.preset,
              "shrink": args.shrink, "copy_bandwidth_GBps": bw / 1e9, "configs": CONFIGS, "rows": rows}
    if timed:
        print(f"copy bandwidth {bw / 1e9:.0f} GB/s")
        print(f"{'shape':13s} {'N':>6} {'K':>5} {'M':>2} {'cuBLAS µs':>9} {'frac':>5} {'ours µs':>8} {'GB/s':>5} "
              f"{'frac':>5} {'x':>5}  best config")
    for shape in shapes(args.preset, args.shrink):
        r = measure(shape, args.device, bw)
        rows.append(r)
        if timed:
            for M, m in r["by_M"].items():
                print(f"{r['name']:13s} {r['N']:6d} {r['K']:5d} {M:>2} {m['us']['cublas']:9.2f} "
                      f"{m['cublas_frac']:5.2f} {m['best_us']:8.2f} {m['best_GBps']:5.0f} {m['best_frac']:5.2f} "
                      f"{m['speedup']:5.2f}  {m['best']}", flush=True)
        else:
            print(f"{r['name']:13s} {r['N']:6d} {r['K']:5d} checks ok={r['ok']}", flush=True)
        write_json(result, args.out)
    if timed:  # one configuration per shape, fixed over M
        result["step"] = {}
        for M in map(str, ROWS):
            cub = sum(r["per_step"] * r["by_M"][M]["us"]["cublas"] for r in rows)
            ours = sum(r["per_step"] * r["by_M"][M]["us"][r["best_over_M"]] for r in rows)
            nbytes = sum(r["per_step"] * r["by_M"][M]["bytes"] for r in rows)
            step = {"bytes": nbytes, "cublas_us": cub, "ours_us": ours,
                    "cublas_frac": nbytes / cub * 1e6 / bw, "ours_frac": nbytes / ours * 1e6 / bw}
            result["step"][M] = step
            print(f"step M={M:>2}: linears {nbytes / 1e6:.0f} MB, cuBLAS {cub:.0f} µs ({step['cublas_frac']:.2f}), "
                  f"ours {ours:.0f} µs ({step['ours_frac']:.2f})")
    finish(result, rows, t0, args.out)


if __name__ == "__main__":
    main()
