"""Triton NVFP4 weight-only GEMM for decode-sized M: bf16 activations x packed E2M1 weights.

Per K tile, the packed bytes and E4M3 block scales are unpacked in registers: an E2M1 code placed
in the top bits of an fp32 (``mag << 22``) is exactly ``e2m1 * 2^-126`` (the zero-exponent codes
land on fp32 subnormals with the right value), so one multiply by ``block_scale * 2^100`` gives
``e2m1 * block_scale * 2^-26``, which bf16 holds exactly (at most 6 significant bits). The tensor
cores accumulate in fp32 and the epilogue multiplies by ``weight_scale_2 * 2^26`` and rounds to
bf16 (round-to-nearest-even on the bits, so the CPU interpreter rounds like the GPU).
"""

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.runtime.interpreter import InterpretedFunction

from ocria.errors import OcriaError
from ocria.plugins.launch import pdl_args, pdl_enter


@triton.jit
def _nvfp4_gemm_kernel(
    x_ptr, w_ptr, s_ptr, g_ptr, y_ptr,
    M, N, K, stride_xm, stride_wn, stride_sn, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_F32: tl.constexpr, PDL: tl.constexpr,
):
    # x and y travel as int16 bits of bf16. DOT_F32 (the CPU interpreter, whose dot cannot take
    # bf16) multiplies the same exact values in fp32.
    pdl_enter(PDL)
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = rm < M
    nmask = rn < N
    rn64 = rn.to(tl.int64)
    # Swapped operands: acc[n, m] = W x^T, so the dequantized weight tile (computed in registers) is
    # the A operand, which the tensor cores take from registers, and the small x tile is B.
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        xb = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=mmask[:, None] & (rk < K)[None, :], other=0)
        rk2 = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        wp = tl.load(w_ptr + rn64[:, None] * stride_wn + rk2[None, :],
                     mask=nmask[:, None] & (rk2 < K // 2)[None, :], other=0).to(tl.int32)
        codes = tl.reshape(tl.join(wp & 0xF, wp >> 4), [BLOCK_N, BLOCK_K])
        v = (((codes & 7) << 22) | ((codes & 8) << 28)).to(tl.float32, bitcast=True)  # e2m1 * 2^-126
        rks = k0 // 16 + tl.arange(0, BLOCK_K // 16)
        sb = tl.load(s_ptr + rn64[:, None] * stride_sn + rks[None, :],
                     mask=nmask[:, None] & (rks < K // 16)[None, :], other=0).to(tl.int32)
        e = (sb >> 3) & 15
        m = sb & 7
        # E4M3 block scale * 2^100: normal ones by exponent rebias, subnormal ones m * 2^-9 * 2^100.
        s = tl.where(e > 0, (((e + 220) << 23) | (m << 20)).to(tl.float32, bitcast=True),
                     m.to(tl.float32) * 2.4758800785707605e27)
        s = tl.where((sb & 0x7F) == 0x7F, float("nan"), s)
        s = tl.reshape(tl.broadcast_to(s[:, :, None], [BLOCK_N, BLOCK_K // 16, 16]), [BLOCK_N, BLOCK_K])
        if DOT_F32:
            x = (xb.to(tl.int32) << 16).to(tl.float32, bitcast=True)
            acc = tl.dot(v * s, tl.trans(x), acc, input_precision="ieee")
        else:
            acc = tl.dot((v * s).to(tl.bfloat16), tl.trans(xb.to(tl.bfloat16, bitcast=True)), acc)
    y = acc * (tl.load(g_ptr) * 67108864.0)
    b = y.to(tl.int32, bitcast=True)
    bits = tl.where(y != y, 0x7FC0, ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF).to(tl.int16)
    tl.store(y_ptr + rm[None, :] * stride_ym + rn[:, None], bits, mask=mmask[None, :] & nmask[:, None])


def default_config(M: int, N: int, num_sms: int = 132) -> dict:
    """Tiles by M and N. For M <= 16 the fastest of the configs timed on the H200 per output width
    (bench/results/quant_gemm_h200_run1.json: the 248k-row head, 4k..12k-row projections, 2k-row
    projections); larger M: one M tile of 32/64 rows and N tiles for ~2 programs per SM."""
    if M <= 16:
        if N >= 65536:
            return {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 512, "num_warps": 4, "num_stages": 3}
        if N >= 4096:
            return {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 256, "num_warps": 4, "num_stages": 6}
        return {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4}
    block_m = 32 if M <= 32 else 64
    block_n = 128
    while block_n > 16 and triton.cdiv(N, block_n) * triton.cdiv(M, block_m) < 2 * num_sms:
        block_n //= 2
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4}


def nvfp4_gemm_triton(
    x: Tensor, weight: Tensor, weight_scale: Tensor, weight_scale_2: Tensor, config: dict | None = None
) -> Tensor:
    """``y = x @ W^T`` for bf16 ``x`` [..., K] and an NVFP4 weight ([N, K/2] uint8, [N, K/16] e4m3, fp32)."""
    if x.device.type != "cuda" and not isinstance(_nvfp4_gemm_kernel, InterpretedFunction):
        raise OcriaError("nvfp4_gemm kernel on CPU needs TRITON_INTERPRET=1 set before triton is imported")
    if x.dtype != torch.bfloat16:
        raise ValueError(f"nvfp4_gemm takes bf16 activations, got {x.dtype}")
    K = x.shape[-1]
    N = weight.shape[0]
    if weight.shape[1] * 2 != K or weight_scale.shape != (N, K // 16) or K % 16:
        raise ValueError(f"NVFP4 weight {tuple(weight.shape)} / scales {tuple(weight_scale.shape)} "
                         f"do not match K={K}")
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    y = torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
    if M > 0:
        cfg = dict(config or default_config(M, N))
        grid = (triton.cdiv(N, cfg["BLOCK_N"]), triton.cdiv(M, cfg["BLOCK_M"]))
        g = weight_scale_2.to(device=x.device, dtype=torch.float32).reshape(1)
        _nvfp4_gemm_kernel[grid](
            x2.view(torch.int16), weight, weight_scale.view(torch.uint8), g, y.view(torch.int16),
            M, N, K, x2.stride(0), weight.stride(0), weight_scale.stride(0), y.stride(0),
            DOT_F32=x.device.type != "cuda", **cfg, **pdl_args(x.device),
        )
    return y.reshape(*x.shape[:-1], N)
