"""Decode GEMMs of a ~2B Qwen3.5-architecture model on the GPU: bf16 (cuBLAS), FP8 (torch._scaled_mm)
and NVFP4 weight-only (our Triton kernel) at M = 1..256, against the weight-bytes floor.

Shapes (K -> N, hidden 2048): lm_head 2048 -> 248320, MLP gate_up 2048 -> 12288 and down
6144 -> 2048; the GDN and attention projections with assumed head counts (GDN in_proj q,k,v,z
2048 -> 8192, attention q(+gate),k,v 2048 -> 5120, out projections 2048 -> 2048).

Rows per shape and M:
  bf16        F.linear with bf16 weights (cuBLAS)
  fp8_gemm    torch._scaled_mm, FP8 activations (already quantized) x FP8 weights, per-tensor scales
  fp8_layer   QuantLinear.forward: activation quantization (Triton) + _scaled_mm
  fp8_decode  ocria::decode_gemm_fp8 on the same quantized activations (M <= 16; what the models run for FP8 layers)
  nvfp4       ocria::nvfp4_gemm with its default tiles (at M = 1 the CUDA-core GEMV); also a few other
              tile/stage configs (the tuning lever, unless --skip-mma-levers; LEVER_CONFIGS for M <= 16,
              LARGE_M_CONFIGS above), at M = 1 the GEMV's
              configurations (``"gemv": true`` in nvfp4_tried), best one reported as nvfp4_best
  nvfp4_mma   M = 1 only: the tensor-core kernel with its default tiles, and (nvfp4_mma_unspecialized_m) the same
              compiled without Triton's specialization of M = 1
  floor       weight bytes of each format (NVFP4: packed weights + block scales) at the device copy
              bandwidth measured in the same run; ``latency_us`` is a trivial kernel in a graph
Correctness first: the NVFP4 kernel against dequantize + fp32 matmul, and the FP8 layer against
the same quantize/dequantize emulation, on every shape at M = 16.
Timing: CUDA graph of R calls over rotating weight copies (>= 256 MB touched), median of replays / R.

    python3 bench/quant_gemm.py --out bench/results/quant_gemm_h200.json
"""

import argparse
import datetime
import json
import os
import shlex
import sys

import torch
import torch.nn.functional as F
import triton

from ocria.bench.timing import copy_bandwidth, rel_err, time_calls
from ocria.plugins import numerics as nx
from ocria.plugins.decode_gemm import MAX_M, decode_gemm_fp8_triton
from ocria.plugins.fp4_gemm import kernel as fp4_kernel
from ocria.plugins.fp4_gemm import nvfp4_gemm, nvfp4_gemm_reference
from ocria.plugins.fp4_gemm.gemv import default_gemv_config, nvfp4_gemv_launch
from ocria.plugins.fp4_gemm.kernel import default_config, nvfp4_gemm_triton
from ocria.quant.linear import QuantLinear

ROTATE_BYTES = 256 << 20
SHAPES = {"lm_head": (2048, 248320), "mlp_gate_up": (2048, 12288), "mlp_down": (6144, 2048),
          "gdn_in_proj_qkvz": (2048, 8192), "attn_qkv": (2048, 5120), "out_proj": (2048, 2048)}
# SLICES: K cut over that many programs per tile (more programs per SM to hide the dequantization's latency).
LEVER_CONFIGS = [
    {"BLOCK_N": 64, "BLOCK_K": 512, "num_warps": 4, "num_stages": 3},
    {"BLOCK_N": 32, "BLOCK_K": 256, "num_warps": 4, "num_stages": 6},
    {"BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 8, "num_stages": 4},
    {"BLOCK_N": 64, "BLOCK_K": 256, "num_warps": 8, "num_stages": 4},
    {"BLOCK_N": 64, "BLOCK_K": 256, "num_warps": 4, "num_stages": 3, "SLICES": 2},
    {"BLOCK_N": 64, "BLOCK_K": 256, "num_warps": 4, "num_stages": 3, "SLICES": 4},
    {"BLOCK_N": 32, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4, "SLICES": 2},
    {"BLOCK_N": 32, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4, "SLICES": 4},
    {"BLOCK_N": 16, "BLOCK_K": 512, "SPLIT_K": 4, "num_warps": 4, "num_stages": 4, "SLICES": 2},
    {"BLOCK_N": 16, "BLOCK_K": 512, "SPLIT_K": 4, "num_warps": 4, "num_stages": 4, "SLICES": 4},
    {"BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4, "SLICES": 2},
]

# M > 16 (verify blocks, batches beyond 16): BLOCK_M is the default's (32 up to M = 32, else 64) unless given.
LARGE_M_CONFIGS = [
    {"BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3},
    {"BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4},
    {"BLOCK_N": 64, "BLOCK_K": 256, "num_warps": 4, "num_stages": 3},
    {"BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3},
    {"BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 8, "num_stages": 3},
    {"BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3, "SLICES": 2},
    {"BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3, "SLICES": 2},
    {"BLOCK_N": 32, "BLOCK_K": 256, "SPLIT_K": 4, "num_warps": 4, "num_stages": 3},
    {"BLOCK_N": 32, "BLOCK_K": 512, "SPLIT_K": 4, "num_warps": 4, "num_stages": 3},
    {"BLOCK_N": 16, "BLOCK_K": 512, "SPLIT_K": 4, "num_warps": 4, "num_stages": 4},
    {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3},
    {"BLOCK_M": 32, "BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3},
]

# The M = 1 CUDA-core GEMV (ocria/plugins/fp4_gemm/gemv.py): rows per program, K tile, warps, prefetch.
GEMV_CONFIGS = [
    {"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": w, "PREFETCH": pf}
    for bn, bk, w, pf in [(8, 512, 4, False), (16, 512, 4, False), (32, 512, 8, False), (8, 1024, 4, False),
                          (4, 512, 2, True), (8, 512, 4, True), (16, 512, 4, True), (4, 1024, 2, True),
                          (8, 1024, 4, True), (8, 2048, 8, True), (4, 2048, 4, True), (4, 2048, 4, False),
                          (8, 2048, 8, False), (2, 2048, 2, False)]
]


def gemv(x, wt, gs, cfg):
    """The NVFP4 GEMV (PTX dequantization) with tile configuration ``cfg`` on one row x."""
    y = torch.empty(1, wt["packed"].shape[0], dtype=torch.bfloat16, device="cuda")
    nvfp4_gemv_launch(x, wt["packed"], wt["block_scales"], gs.float().reshape(1), y, True, {"PDL": False,
                      "launch_pdl": False}, cfg)
    return y


def make_weights(k: int, n: int) -> dict:
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    ws = (w.float().abs().amax() / 448.0).reshape(1)
    gs = nx.nvfp4_global_scale(w.float().abs().amax()).cuda()
    packed, bscales = nx.quantize_nvfp4(w, gs)
    return {"bf16": w, "fp8": nx.quantize_fp8(w, ws), "fp8_scale": ws.reshape(()), "packed": packed,
            "block_scales": bscales, "global_scale": gs}


def correctness(name: str, k: int, n: int, wts: dict) -> dict:
    x = torch.randn(16, k, device="cuda").to(torch.bfloat16)
    got = nvfp4_gemm(x, wts["packed"], wts["block_scales"], wts["global_scale"]).float()
    ref = nvfp4_gemm_reference(x, wts["packed"], wts["block_scales"], wts["global_scale"]).float()
    in_scale = (x.float().abs().amax() / 448.0).reshape(())
    layer = QuantLinear("fp8", wts["fp8"], weight_scale=wts["fp8_scale"], input_scale=in_scale)
    y8 = layer(x).float()
    xq = nx.dequantize_fp8(nx.quantize_fp8(x, in_scale), in_scale, torch.float32)
    ref8 = xq @ nx.dequantize_fp8(wts["fp8"], wts["fp8_scale"], torch.float32).t()
    y8d = decode_gemm_fp8_triton(nx.quantize_fp8(x, in_scale), wts["fp8"], in_scale, wts["fp8_scale"]).float()
    return {"shape": name, "nvfp4_max_rel_err": rel_err(got, ref), "fp8_layer_max_rel_err": rel_err(y8, ref8),
            "fp8_decode_max_rel_err": rel_err(y8d, ref8), "nvfp4_ok": rel_err(got, ref) < 1e-2,
            "fp8_ok": rel_err(y8, ref8) < 1e-2 and rel_err(y8d, ref8) < 1e-2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ms", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES))
    ap.add_argument("--out", default="bench/results/quant_gemm_h200.json")
    ap.add_argument("--skip-mma-levers", action="store_true", help="time only the default NVFP4 MMA tiles")
    args = ap.parse_args()
    torch.manual_seed(0)
    bw = copy_bandwidth()
    tiny = torch.zeros(1, device="cuda")
    latency = time_calls([lambda: tiny.add_(1)], min_calls=50)
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s, trivial kernel in a graph {latency:.2f} µs")
    checks, rows, errors = [], [], []
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": __import__("triton").__version__,
              "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
              "copy_bandwidth_TBps": bw / 1e12, "trivial_kernel_us": latency, "correctness": checks, "errors": errors,
              "rows": rows}
    print(f"{'shape':17s} {'M':>4} {'bf16':>8} {'fp8':>8} {'fp8lay':>8} {'fp8dec':>8} {'nvfp4':>8} {'best':>8} | "
          f"floors {'bf16':>7} {'fp8':>7} {'nvfp4':>7} | x floor bf16 fp8 nvfp4")
    for name in args.shapes:
        k, n = SHAPES[name]
        base = make_weights(k, n)
        checks.append(correctness(name, k, n, base))
        print(json.dumps(checks[-1]))
        nbytes = {"bf16": 2 * n * k, "fp8": n * k, "nvfp4": n * k // 2 + n * k // 16}
        sets = {}
        for fmt, keys in (("bf16", ["bf16"]), ("fp8", ["fp8"]), ("nvfp4", ["packed", "block_scales"])):
            copies = max(1, min(64, -(-ROTATE_BYTES // nbytes[fmt])))
            sets[fmt] = [base] + [{kk: base[kk].clone() for kk in keys} for _ in range(copies - 1)]
        gs, ws = base["global_scale"], base["fp8_scale"]
        layers = [QuantLinear("fp8", s["fp8"], weight_scale=ws, input_scale=torch.tensor(0.01, device="cuda"))
                  for s in sets["fp8"]]
        for m in args.ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            xq = nx.quantize_fp8(x, torch.tensor(0.01, device="cuda"))
            sa = torch.tensor(0.01, device="cuda")
            t = {"bf16": time_calls([lambda s=s, x=x: F.linear(x, s["bf16"]) for s in sets["bf16"]])}
            try:
                t["fp8_gemm"] = time_calls([lambda s=s, xq=xq, sa=sa, ws=ws: torch._scaled_mm(
                    xq, s["fp8"].t(), scale_a=sa, scale_b=ws, out_dtype=torch.bfloat16) for s in sets["fp8"]])
                t["fp8_layer"] = time_calls([lambda lay=lay, x=x: lay(x) for lay in layers])
                if m <= MAX_M:
                    t["fp8_decode"] = time_calls([lambda s=s, xq=xq, sa=sa, ws=ws: decode_gemm_fp8_triton(
                        xq, s["fp8"], sa, ws) for s in sets["fp8"]])
            except RuntimeError as e:  # recorded, not fatal: the other rows still get measured
                t["fp8_gemm"] = t["fp8_layer"] = float("nan")
                errors.append(f"{name} M={m} fp8: {str(e)[:200]}")
            t["nvfp4"] = time_calls([lambda s=s, x=x, gs=gs: nvfp4_gemm(x, s["packed"], s["block_scales"], gs)
                                     for s in sets["nvfp4"]])
            tried = [{"config": default_config(m, n), "us": t["nvfp4"]}]
            if not args.skip_mma_levers:  # each config against the reference: only correct ones can be best
                ref = nvfp4_gemm_reference(x, base["packed"], base["block_scales"], gs)
                levers = LEVER_CONFIGS if m <= 16 else LARGE_M_CONFIGS
                for lever in levers:
                    cfg = {"BLOCK_M": 16 if m <= 16 else default_config(m, n)["BLOCK_M"], **lever}
                    err = rel_err(nvfp4_gemm_triton(x, base["packed"], base["block_scales"], gs, cfg), ref)
                    us = time_calls([lambda s=s, x=x, gs=gs, c=cfg: nvfp4_gemm_triton(
                        x, s["packed"], s["block_scales"], gs, c) for s in sets["nvfp4"]])
                    tried.append({"config": cfg, "us": us, "max_rel_err": err})
            if m == 1:  # the CUDA-core GEMV (default path at M = 1) and, for the A/B, the MMA kernel forced
                ref = nvfp4_gemm_reference(x, base["packed"], base["block_scales"], gs)
                mma_cfg = default_config(m, n)
                t["nvfp4_mma"] = time_calls([lambda s=s, x=x, gs=gs, c=mma_cfg: nvfp4_gemm_triton(
                    x, s["packed"], s["block_scales"], gs, c) for s in sets["nvfp4"]])
                spec = fp4_kernel._nvfp4_gemm_kernel  # M = 1 is specialized by Triton: the A/B without that
                fp4_kernel._nvfp4_gemm_kernel = triton.jit(do_not_specialize=["M"])(spec.fn)
                try:
                    t["nvfp4_mma_unspecialized_m"] = time_calls([lambda s=s, x=x, gs=gs, c=mma_cfg: nvfp4_gemm_triton(
                        x, s["packed"], s["block_scales"], gs, c) for s in sets["nvfp4"]])
                finally:
                    fp4_kernel._nvfp4_gemm_kernel = spec
                for cfg in [default_gemv_config(n, k)] + GEMV_CONFIGS:
                    err = rel_err(gemv(x, base, gs, cfg), ref)
                    us = time_calls([lambda s=s, x=x, gs=gs, c=cfg: gemv(x, s, gs, c) for s in sets["nvfp4"]])
                    tried.append({"config": {"gemv": True, **cfg}, "us": us, "max_rel_err": err})
            best = min((r for r in tried if r.get("max_rel_err", 0.0) < 1e-2), key=lambda r: r["us"])
            floors = {f: nbytes[f] / bw * 1e6 for f in nbytes}
            row = {"shape": name, "K": k, "N": n, "M": m, "bf16_weight_MB": nbytes["bf16"] / 1e6, **{
                f"{kk}_us": v for kk, v in t.items()}, "nvfp4_best_us": best["us"], "nvfp4_best_config": best["config"],
                "nvfp4_tried": tried, **{f"floor_{f}_us": v for f, v in floors.items()},
                "x_floor_bf16": t["bf16"] / floors["bf16"], "x_floor_fp8": t["fp8_gemm"] / floors["fp8"],
                "x_floor_nvfp4": best["us"] / floors["nvfp4"], "latency_us": latency}
            rows.append(row)
            print(f"{name:17s} {m:4d} {t['bf16']:8.2f} {t['fp8_gemm']:8.2f} {t['fp8_layer']:8.2f} "
                  f"{t.get('fp8_decode', float('nan')):8.2f} {t['nvfp4']:8.2f} "
                  f"{best['us']:8.2f} | {floors['bf16']:7.2f} {floors['fp8']:7.2f} {floors['nvfp4']:7.2f} | "
                  f"{row['x_floor_bf16']:.2f} {row['x_floor_fp8']:.2f} {row['x_floor_nvfp4']:.2f}")
        del sets, layers, base
        torch.cuda.empty_cache()
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out + ".tmp", "w") as f:
            json.dump(result, f, indent=1)
        os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
