"""The decode GEMM (``ocria::decode_gemm``, bf16) and its FP8 form (``ocria::decode_gemm_fp8``) on the linears of a
decode step (1 and 16 rows), against cuBLAS (``F.linear``; ``torch._scaled_mm`` for FP8).

Floor: the weight once, x in, the output out. Check: within one bf16 rounding of the fp32 product rounded once
(tests/test_decode_gemm.py: the sum order differs from the exact product's)."""

import torch
import torch.nn.functional as F

from bench.ops.presets import linear_shapes
from bench.ops.ptxas import Sm90Build
from bench.ops.registry import Floor, Inputs, OpBench, Shape, Tolerance, Variant, leading_rows, shape
from bench.ops.switches import current
from ocria.plugins.decode_gemm import decode_gemm, decode_gemm_fp8, decode_gemm_fp8_fp32, decode_gemm_fp32
from ocria.plugins.decode_gemm.kernel import BLOCK_M, _decode_gemm_kernel, default_config

ROWS = (1, 16)
ONE_ROUNDING = Tolerance("rel", 1e-2, "one bf16 rounding of the output (tests/test_decode_gemm.py)")


def gemm_shapes() -> tuple[Shape, ...]:
    """Every linear of both presets at 1 and 16 rows, and two tiny CPU shapes (one and four 16-row tiles of N)."""
    shapes = [shape(f"{label}_{layer}_m{m}", M=m, N=n, K=k)
              for label in ("mini", "sim") for layer, (n, k) in linear_shapes(label).items() for m in ROWS]
    return (shape("cpu_m3", cpu=True, M=3, N=64, K=96), *shapes)


def bf16_inputs(s: Shape, device: torch.device, g: torch.Generator) -> Inputs:
    """x [M, K] and weight [N, K] bf16, the weight scaled to unit outputs."""
    K = s["K"]
    return {"x": torch.randn(s["M"], K, generator=g, device=device).to(torch.bfloat16),
            "w": (torch.randn(s["N"], K, generator=g, device=device) * K**-0.5).to(torch.bfloat16)}


def bf16_floor(s: Shape) -> Floor:
    M, N, K = s["M"], s["N"], s["K"]
    return Floor(2 * N * K + 2 * M * (K + N), 2 * M * N * K)


def fp8_inputs(s: Shape, device: torch.device, g: torch.Generator) -> Inputs:
    """E4M3 q [M, K] with per-token scales [M, 1], E4M3 weight [N, K] with per-column scales [N]."""
    M, N, K = s["M"], s["N"], s["K"]
    return {"q": (torch.randn(M, K, generator=g, device=device) * 40).to(torch.float8_e4m3fn),
            "w": (torch.randn(N, K, generator=g, device=device) * 40).to(torch.float8_e4m3fn),
            "x_scale": torch.rand(M, 1, generator=g, device=device) * 1e-2,
            "w_scale": torch.rand(N, generator=g, device=device) * 1e-3}


def fp8_floor(s: Shape) -> Floor:
    M, N, K = s["M"], s["N"], s["K"]
    return Floor(N * K + M * K + 2 * M * N + 4 * (M + N), 2 * M * N * K)


def _scaled_mm(i: Inputs) -> tuple[torch.Tensor]:
    """cuBLAS's FP8 GEMM with row-wise scales (what an FP8 layer runs when the decode GEMM does not take the call)."""
    return (torch._scaled_mm(i["q"], i["w"].t(), scale_a=i["x_scale"], scale_b=i["w_scale"].reshape(1, -1),
                             out_dtype=torch.bfloat16),)


TYPES = dict(x_ptr="*bf16", w_ptr="*bf16", b_ptr="*bf16", o_ptr="*bf16", ws_ptr="*fp32", count_ptr="*i32",
             r_ptr="*bf16", nw_ptr="*bf16", s_ptr="*bf16", sx_ptr="*fp32", sw_ptr="*fp32", eps="fp32", M="i32",
             N="i32", K="i32", K_SPLIT="i32", stride_xm="i32", stride_wn="i32", stride_om="i32", stride_rm="i32")
# M varies and is left unmarked.
DIVISIBLE_BY_16 = ("x_ptr", "w_ptr", "b_ptr", "o_ptr", "ws_ptr", "count_ptr", "r_ptr", "nw_ptr", "s_ptr", "sx_ptr",
                   "sw_ptr", "N", "K", "K_SPLIT", "stride_xm", "stride_wn", "stride_om", "stride_rm")


def sm90_build(s: Shape, fp8: bool = False) -> Sm90Build:
    """The kernel with ``default_config`` for the shape, as a launch specializes it."""
    cfg = default_config(s["N"], s["K"])
    names = _decode_gemm_kernel.arg_names
    consts = dict(HAS_BIAS=False, SWAP=cfg["swap"], AS_BITS=False, SPLIT_K=cfg["split_k"], NORM=False, RESIDUAL=False,
                  OUT_F32=False, FP8=fp8, SX_ROWS=fp8, SW_COLS=fp8, BLOCK_M=BLOCK_M, BLOCK_N=cfg["block_n"],
                  BLOCK_K=cfg["block_k"], PDL=False, PF_LINES=8, ROW_TILES=1)
    types = {k: v for k, v in TYPES.items() if k in names}
    if fp8:
        types.update(x_ptr="*fp8e4nv", w_ptr="*fp8e4nv")
    return Sm90Build(_decode_gemm_kernel, types, {k: v for k, v in consts.items() if k in names}, cfg["num_warps"],
                     cfg["num_stages"], tuple(n for n in DIVISIBLE_BY_16 if n in names))


BENCHES = (
    OpBench(
        name="decode_gemm", shapes=gemm_shapes(), inputs=bf16_inputs, floor=bf16_floor,
        reference=lambda i: (decode_gemm_fp32(i["x"], i["w"]),),
        variants={"kernel": Variant(lambda i: (decode_gemm(i["x"], i["w"], policy=current()),)),
                  "cublas": Variant(lambda i: (F.linear(i["x"], i["w"]),), kernel=False)},
        check=ONE_ROUNDING, baseline="cublas", rows=lambda i, r: leading_rows(i, r, ("x",)),
        ptxas={"kernel": sm90_build}),
    OpBench(
        name="decode_gemm_fp8", shapes=gemm_shapes(), inputs=fp8_inputs, floor=fp8_floor,
        reference=lambda i: (decode_gemm_fp8_fp32(i["q"], i["w"], i["x_scale"], i["w_scale"]),),
        variants={"kernel": Variant(lambda i: (decode_gemm_fp8(i["q"], i["w"], i["x_scale"], i["w_scale"],
                                                               policy=current()),)),
                  "scaled_mm": Variant(_scaled_mm, cuda_only=True, kernel=False)},
        check=ONE_ROUNDING, baseline="scaled_mm", rows=lambda i, r: leading_rows(i, r, ("q", "x_scale")),
        ptxas={"kernel": lambda s: sm90_build(s, fp8=True)}),
)
