"""Triton NVFP4 weight-only GEMV for one activation row (M = 1, a batch-1 decode step) on the CUDA cores.

Why not the tensor-core kernel: at M = 1 its 16-row MMA tile is 1/16 used and the dequantized weights must be
laid out (and on wgmma staged in shared memory) for the MMA, which left it at 4.8x its bytes' floor on the H200,
no faster than the bf16 GEMM it replaces. Here each thread keeps its weights where they were loaded: per 8
weights the PTX dequantization of ``dequant.DEQUANT_F32_ASM`` (exact products ``e2m1 * block_scale * 2^-26`` in
bf16, widened to fp32 in the register) and 8 fp32 FMAs against x, summed across K once after the loop,
times ``weight_scale_2 * 2^26`` and rounded once to bf16.

Numerics: the same products as the tensor-core kernel and the reference (each exact in fp32), accumulated in fp32
in another order, so a row's output can differ from the M = 16 kernel's by the fp32 sum's rounding (the decode
engine's lossless check treats that as path noise, as it does for bf16 ar against verify steps). Without PTX (the
CPU interpreter, ``nvfp4_ptx`` disabled, GPUs before sm_89) the codes are unpacked with integers to the same
values in fp32.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from ocria.plugins.fp4_gemm.dequant import DEQUANT_F32_ASM, block_scale_bf16, block_scale_f32, e2m1_f32, repeat_cols
from ocria.plugins.launch import pdl_enter
from ocria.plugins.rounding import bf16_bits


@triton.jit
def _codes_f32(wh, j: tl.constexpr, s4):
    """Code j of each int16 word (4 codes, low nibble first) as fp32 ``e2m1 * s4`` (integer unpacking)."""
    return e2m1_f32((wh.to(tl.int32) >> (4 * j)) & 0xF) * s4  # e2m1 * 2^-126 * scale * 2^100


@triton.jit
def _load_tile(ws, ss, xs, k0, K, rw, rs, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """The K tile at k0: packed words, block-scale bytes and x words. With EVEN_K a k0 past the end rereads the
    last tile (the prefetch after the last one: never used), so no load needs a mask."""
    if EVEN_K:
        k0 = tl.minimum(k0, K - BLOCK_K)  # the same tile where k0 < K
        return tl.load(ws + k0 // 4), tl.load(ss + k0 // 16), tl.load(xs + k0 // 4)
    else:
        return (tl.load(ws + k0 // 4, mask=(k0 // 4 + rw < K // 4)[None, :], other=0),
                tl.load(ss + k0 // 16, mask=(k0 // 16 + rs < K // 16)[None, :], other=0),
                tl.load(xs + k0 // 4, mask=k0 // 4 + rw < K // 4, other=0))


@triton.jit
def _accumulate(acc, wh, sb, xw, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PTX_DEQUANT: tl.constexpr):
    """acc [BLOCK_N, BLOCK_K / 4] += code j of word i times x_j[i], for j = 0..3."""
    x0 = ((xw << 16) & 0xFFFF0000).to(tl.int32).to(tl.float32, bitcast=True)  # x word i = x[4i .. 4i+3]
    x1 = (xw & 0xFFFF0000).to(tl.int32).to(tl.float32, bitcast=True)
    x2 = ((xw >> 16) & 0xFFFF0000).to(tl.int32).to(tl.float32, bitcast=True)
    x3 = ((xw >> 32) & 0xFFFF0000).to(tl.int32).to(tl.float32, bitcast=True)
    if PTX_DEQUANT:
        sc4 = repeat_cols(block_scale_bf16(sb.to(tl.float8e4nv, bitcast=True)), 4)
        c0, c1, c2, c3 = tl.inline_asm_elementwise(DEQUANT_F32_ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r,r", [wh, sc4],
                                                   dtype=(tl.float32,) * 4, is_pure=True, pack=2)
    else:
        s4 = repeat_cols(block_scale_f32(sb), 4)
        c0, c1, c2, c3 = _codes_f32(wh, 0, s4), _codes_f32(wh, 1, s4), _codes_f32(wh, 2, s4), _codes_f32(wh, 3, s4)
    acc = tl.fma(c0, x0[None, :], acc)
    acc = tl.fma(c1, x1[None, :], acc)
    acc = tl.fma(c2, x2[None, :], acc)
    return tl.fma(c3, x3[None, :], acc)


@triton.jit
def _nvfp4_gemv_kernel(
    x_ptr, w_ptr, s_ptr, g_ptr, y_ptr, N, K, stride_wn, stride_sn,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, PREFETCH: tl.constexpr,
    PTX_DEQUANT: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    # Program: BLOCK_N weight rows. Word i of a K tile (int16: codes of k = 4i .. 4i+3) meets x[4i + j] as x_j[i],
    # so the four codes of a word need no reordering. Rows past N read row N - 1 (not stored). Triton does not
    # pipeline loads that feed no dot; PREFETCH loads tile k + 1 by hand before tile k is used (more bytes in
    # flight, more registers: it pays on long K rows only, see default_gemv_config).
    pdl_enter(PDL)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rnc = tl.minimum(rn, N - 1).to(tl.int64)
    rw = tl.arange(0, BLOCK_K // 4)
    rs = tl.arange(0, BLOCK_K // 16)
    ws = w_ptr.to(tl.pointer_type(tl.int16)) + rnc[:, None] * (stride_wn // 2) + rw[None, :]
    ss = s_ptr + rnc[:, None] * stride_sn + rs[None, :]
    xs = x_ptr.to(tl.pointer_type(tl.int64)) + rw  # word i of x: x[4i .. 4i+3] as one int64
    acc = tl.zeros([BLOCK_N, BLOCK_K // 4], dtype=tl.float32)
    if PREFETCH:
        wh, sb, xw = _load_tile(ws, ss, xs, 0, K, rw, rs, BLOCK_K, EVEN_K)
        for k0 in range(BLOCK_K, K + BLOCK_K, BLOCK_K):
            wh_next, sb_next, xw_next = _load_tile(ws, ss, xs, k0, K, rw, rs, BLOCK_K, EVEN_K)
            acc = _accumulate(acc, wh, sb, xw, BLOCK_N, BLOCK_K, PTX_DEQUANT)
            wh, sb, xw = wh_next, sb_next, xw_next
    else:
        for k0 in range(0, K, BLOCK_K):
            wh, sb, xw = _load_tile(ws, ss, xs, k0, K, rw, rs, BLOCK_K, EVEN_K)
            acc = _accumulate(acc, wh, sb, xw, BLOCK_N, BLOCK_K, PTX_DEQUANT)
    y = tl.sum(acc, axis=1) * (tl.load(g_ptr) * 67108864.0)
    tl.store(y_ptr + rn, bf16_bits(y), mask=rn < N)


def default_gemv_config(N: int, K: int) -> dict:
    """Rows per program, K tile, warps and prefetch for a weight [N, K]: per class, the fastest (or within 3% of
    it) of a sweep on the H200 (``python -m bench.ops.run --op fp4_gemm``). Rows of up to 2048 with 8192
    outputs or more (gate_up, the GDN in-projection, the LM head): 16 rows in 512-wide tiles, no prefetch
    (gate_up 8.6 us; 10.0 with prefetch). Fewer outputs (attention in- and out-projections): 8 rows in 1024-wide
    tiles, more programs for the SMs (attn_qkv 5.1 us; 6.2 in the 16-row tiles). Longer rows
    (down_proj's 6144): 8 rows in 2048-wide tiles with prefetch (6.1 us; 6.4 without, 10.4 in 512-wide tiles)."""
    if K > 2048:
        return {"BLOCK_N": 8, "BLOCK_K": 2048 if K % 2048 == 0 else 1024, "num_warps": 8 if K % 2048 == 0 else 4,
                "PREFETCH": True}
    if N >= 8192:
        return {"BLOCK_N": 16, "BLOCK_K": 512, "num_warps": 4, "PREFETCH": False}
    return {"BLOCK_N": 8, "BLOCK_K": 1024, "num_warps": 4, "PREFETCH": False}


def nvfp4_gemv_launch(x: Tensor, weight: Tensor, weight_scale: Tensor, g: Tensor, y: Tensor, ptx_dequant: bool,
                      pdl: dict, config: dict | None = None) -> None:
    """y [1, N] (bf16) = x [1, K] (bf16) @ W^T for a checked NVFP4 weight; ``g`` the fp32 ``weight_scale_2``."""
    N, K = weight.shape[0], x.shape[-1]
    cfg = config or default_gemv_config(N, K)
    _nvfp4_gemv_kernel[(triton.cdiv(N, cfg["BLOCK_N"]),)](
        x.view(torch.int16), weight, weight_scale.view(torch.uint8), g, y.view(torch.int16), N, K,
        weight.stride(0), weight_scale.stride(0), BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
        EVEN_K=K % cfg["BLOCK_K"] == 0, PREFETCH=cfg.get("PREFETCH", False), PTX_DEQUANT=ptx_dequant,
        num_warps=cfg["num_warps"], **pdl,
    )
