"""Triton NVFP4 weight-only GEMM for decode-sized M: bf16 activations x packed E2M1 weights.
One-row calls (M = 1, no explicit config) run ``gemv`` on the CUDA cores instead, unless ``nvfp4_gemv`` is
disabled in the execution policy, or x is not 8-byte aligned (the GEMV reads it as int64 words). In a
batch-invariant step (``Launch.INVARIANT``, the policy's ``for_steps``) every call takes the 16-row configuration of
its width, whatever M, so a row's sums do not depend on how many rows share the launch.

Exactness: an E2M1 value has at most 2 significant bits and an E4M3 block scale at most 4, so
``e2m1 * block_scale * 2^-26`` is exact in bf16 (normal range: 2^-36 .. 2^12). Each K tile is
dequantized to that value, the tensor cores accumulate ``W x^T`` in fp32 and the epilogue multiplies
by ``weight_scale_2 * 2^26`` and rounds to bf16 (round-to-nearest-even on the bits, so the CPU
interpreter rounds like the GPU). E2M1 code bits placed at the bottom of a float's exponent field read
as ``e2m1 * 2^-126`` (the zero-exponent codes 0 and 0.5 land on subnormals with the right value);
times ``block_scale * 2^100`` (a normal number, exact in fp32 and bf16; the NaN codes 0x7F/0xFF give
NaN, zero gives zero, subnormal scales keep their value, the sign is kept) that is the value above.

- ``PTX_DEQUANT`` (CUDA, sm_89+): ``dequant.DEQUANT_ASM`` builds the bf16 bit patterns of two codes per 32-bit
  register and applies the scale with one ``fma.rn.bf16x2`` (``v * s + -0``: the product, rounded once, so
  exact; bf16 arithmetic keeps subnormal inputs) per two weights. The scale is Triton's E4M3 -> fp32
  conversion (the hardware's, exact) times 2^100, rounded to bf16 (exact). On by default: on the H200 it took
  M = 1 from 518 to 203 us for the LM head and from 57.5 to 12.0 us for mlp_down, with the same error against
  the reference as the integer path;
  OCRIA_DISABLE_KERNELS=nvfp4_ptx unpacks with integers instead.
- Otherwise (GPUs before sm_89, ``nvfp4_ptx`` disabled, the CPU interpreter): the same values in fp32 from
  integer unpacking, cast to bf16 for the tensor cores, or kept in fp32 for a fp32 dot in the CPU interpreter
  (``DOT_F32``: it runs no inline PTX and its dot cannot take bf16).

``SLICES`` (a config key, default 1) cuts K over that many programs per tile, reduced in the launch
(``ocria.plugins.splitk``): at M = 1 the 12288-wide MLP projection has 192 programs of 4 warps for 132 SMs,
too few warps to hide the dequantization's dependent instructions (5x its bytes' floor on the H200). Timed on the
H200 it never won: no default tile uses it.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.runtime.interpreter import InterpretedFunction

from ocria.errors import OcriaError
from ocria.plugins.fp4_gemm.dequant import DEQUANT_ASM, block_scale_bf16, block_scale_f32, e2m1_f32, repeat_cols
from ocria.plugins.fp4_gemm.gemv import nvfp4_gemv_launch
from ocria.plugins.launch import capability, pdl_args, pdl_enter
from ocria.plugins.policy import DEFAULT_LAUNCH, Launch
from ocria.plugins.rounding import bf16_bits
from ocria.plugins.splitk import scratch, sum_splits


@triton.jit
def _store_bf16(acc, g_ptr, y_ptr, rm, rn, mmask, nmask, stride_ym):
    """acc [BLOCK_N, BLOCK_M] times ``weight_scale_2 * 2^26``, rounded once to bf16 bits (round-to-nearest-even)."""
    bits = bf16_bits(acc * (tl.load(g_ptr) * 67108864.0))
    tl.store(y_ptr + rm[None, :] * stride_ym + rn[:, None], bits, mask=mmask[None, :] & nmask[:, None])


@triton.jit(do_not_specialize=["M"])  # one binary for every row count: rows stay batch invariant
def _nvfp4_gemm_kernel(
    x_ptr, w_ptr, s_ptr, g_ptr, y_ptr, ws_ptr, count_ptr,
    M, N, K, K_SLICE, stride_xm, stride_wn, stride_sn, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, SLICES: tl.constexpr,
    EVEN_K: tl.constexpr, PTX_DEQUANT: tl.constexpr, DOT_F32: tl.constexpr, PDL: tl.constexpr,
):
    # x and y travel as int16 bits of bf16. PTX_DEQUANT (CUDA, sm_89+: Triton's E4M3 type): _DEQUANT_ASM; SPLIT_K
    # and EVEN_K (K is a multiple of BLOCK_K: no K masks) apply to it. Otherwise integer unpacking in fp32, then
    # the tensor cores in bf16 or, DOT_F32 (the CPU interpreter, whose dot cannot take bf16), a dot in fp32.
    # SLICES > 1: program (n, m, s) takes K's s-th slice of K_SLICE (a multiple of BLOCK_K), reduced in the launch.
    pdl_enter(PDL)
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    if SLICES == 1:  # bounds known at compile time: the K loop compiles as without slices (127 registers, not 163)
        k_start = 0
        k_end = K
    else:
        k_start = pid_s * K_SLICE
        k_end = tl.minimum(K, k_start + K_SLICE)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = rm < M
    nmask = rn < N
    # Swapped operands: acc[n, m] = W x^T, so the dequantized weight tile (computed in registers) is
    # the A operand, which mma.sync takes from registers (wgmma: Triton stages it in shared memory), and
    # the small x tile is B.
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    if not PTX_DEQUANT:
        rn64 = rn.to(tl.int64)
        for k0 in range(k_start, k_end, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            xb = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=mmask[:, None] & (rk < K)[None, :],
                         other=0)
            rk2 = k0 // 2 + tl.arange(0, BLOCK_K // 2)
            wp = tl.load(w_ptr + rn64[:, None] * stride_wn + rk2[None, :],
                         mask=nmask[:, None] & (rk2 < K // 2)[None, :], other=0).to(tl.int32)
            codes = tl.reshape(tl.join(wp & 0xF, wp >> 4), [BLOCK_N, BLOCK_K])
            v = e2m1_f32(codes)
            rks = k0 // 16 + tl.arange(0, BLOCK_K // 16)
            sb = tl.load(s_ptr + rn64[:, None] * stride_sn + rks[None, :],
                         mask=nmask[:, None] & (rks < K // 16)[None, :], other=0).to(tl.int32)
            s = repeat_cols(block_scale_f32(sb), 16)
            if DOT_F32:
                x = (xb.to(tl.int32) << 16).to(tl.float32, bitcast=True)
                acc = tl.dot(v * s, tl.trans(x), acc, input_precision="ieee")
            else:
                acc = tl.dot((v * s).to(tl.bfloat16), tl.trans(xb.to(tl.bfloat16, bitcast=True)), acc)
    else:
        # Rows past M or N read the last row instead of being masked (their outputs are not stored).
        rmc = tl.minimum(rm, M - 1)
        rnc = tl.minimum(rn, N - 1).to(tl.int64)
        rk = tl.arange(0, BLOCK_K)
        rk4 = tl.arange(0, BLOCK_K // 4)
        rks = tl.arange(0, BLOCK_K // 16)
        xs = x_ptr.to(tl.pointer_type(tl.bfloat16)) + rmc[:, None] * stride_xm + rk[None, :]
        ws = w_ptr.to(tl.pointer_type(tl.int16)) + rnc[:, None] * (stride_wn // 2) + rk4[None, :]
        ss = s_ptr.to(tl.pointer_type(tl.float8e4nv)) + rnc[:, None] * stride_sn + rks[None, :]
        # SPLIT_K > 1: the tile's K is cut into SPLIT_K slices, a batched dot gives each warp its own slice (a
        # warp needs 16 rows of its own; without this a 16-row tile has all warps dequantize the same rows).
        acc3 = tl.zeros([SPLIT_K, BLOCK_N, BLOCK_M], dtype=tl.float32)
        for k0 in range(k_start, k_end, BLOCK_K):
            if EVEN_K:
                xb = tl.load(xs + k0)
                wh = tl.load(ws + k0 // 4)
                sb = tl.load(ss + k0 // 16)
            else:
                xb = tl.load(xs + k0, mask=(k0 + rk < K)[None, :], other=0.0)
                wh = tl.load(ws + k0 // 4, mask=(k0 // 4 + rk4 < K // 4)[None, :], other=0)
                sb = tl.load(ss + k0 // 16, mask=(k0 // 16 + rks < K // 16)[None, :], other=0.0)
            sc4 = repeat_cols(block_scale_bf16(sb), 4)
            c0, c1, c2, c3 = tl.inline_asm_elementwise(DEQUANT_ASM, "=r,=r,=r,=r,r,r", [wh, sc4],
                                                       dtype=(tl.bfloat16,) * 4, is_pure=True, pack=2)
            # K order within each 8-weight word g: position 8g + 2j + h holds code 4h + j (c_j of half h), so a
            # thread's bf16x2 registers are the asm's outputs as they are; x is permuted the same way.
            c01 = tl.join(tl.reshape(c0, [BLOCK_N, BLOCK_K // 8, 2]), tl.reshape(c1, [BLOCK_N, BLOCK_K // 8, 2]))
            c23 = tl.join(tl.reshape(c2, [BLOCK_N, BLOCK_K // 8, 2]), tl.reshape(c3, [BLOCK_N, BLOCK_K // 8, 2]))
            w = tl.reshape(tl.permute(tl.join(c01, c23), (0, 1, 4, 3, 2)), [BLOCK_N, BLOCK_K])
            xp = tl.reshape(tl.permute(tl.reshape(xb, [BLOCK_M, BLOCK_K // 8, 2, 4]), (0, 1, 3, 2)), [BLOCK_M, BLOCK_K])
            if SPLIT_K == 1:
                acc = tl.dot(w, tl.trans(xp), acc)
            else:
                w3 = tl.permute(tl.reshape(w, [BLOCK_N, SPLIT_K, BLOCK_K // SPLIT_K]), (1, 0, 2))
                x3 = tl.permute(tl.reshape(xp, [BLOCK_M, SPLIT_K, BLOCK_K // SPLIT_K]), (1, 2, 0))
                acc3 = tl.dot(w3, x3, acc3)
        if SPLIT_K > 1:
            acc = tl.sum(acc3, axis=0)
    if SLICES == 1:
        _store_bf16(acc, g_ptr, y_ptr, rm, rn, mmask, nmask, stride_ym)
    else:
        last, total = sum_splits(acc, ws_ptr, count_ptr, pid_n * tl.num_programs(1) + pid_m, pid_s, SLICES, BLOCK_N,
                                 BLOCK_M)
        if last:
            _store_bf16(total, g_ptr, y_ptr, rm, rn, mmask, nmask, stride_ym)


def default_config(M: int, N: int, num_sms: int = 132) -> dict:
    """Tiles by M and N, chosen on the K loop's instructions per weight, registers and shared memory, and timed
    with ``python -m bench.ops.run --op fp4_gemm``.
    M <= 16, by output width: the 248k-row head in 128-row tiles (wgmma, 3 programs per SM); 8k..64k rows in
    32-row tiles with a 6-deep pipeline (fastest of 12 configurations at M = 1 and 16 for gate_up and GDN
    in_proj on the H200, ahead of 64-row tiles and of K slices);
    narrower outputs in 16-row tiles whose 4 warps each take a quarter of the 512-wide K tile (SPLIT_K,
    mma.sync), so that N / 16 programs still give an SM 4 warps.
    17..64 rows below 64k outputs, from the sweep of 12 configurations at M = 32 and 64
    on the H200: outputs up to 4096 wide (down_proj, out projections) keep the
    16-row tiles over 512-wide K tiles, 4 deep (mlp_down at M = 64: 26.3 -> 18.3 us); wider ones take 32-row
    tiles split over the warps at M <= 32 and 64-row wgmma tiles at M <= 64 (gate_up at M = 64: 30.7 -> 25.0
    us). Each is the sweep's fastest or within 1.5% of it for the five projection shapes, but for gate_up at
    M = 64, 5% behind the same tile with K over two programs (``SLICES`` 2), which lost on the other shapes.
    Larger M or outputs: one M tile of 32/64 rows and N tiles for ~2 programs per SM, in 3 stages (wgmma tiles
    also stage the dequantized weights and the reordered x in shared memory); tiles under 64 rows split K over
    the warps likewise."""
    if M <= 16:
        if N >= 65536:
            return {"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 128, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4}
        if N >= 8192:
            return {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 256, "SPLIT_K": 1, "num_warps": 4, "num_stages": 6}
        return {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 512, "SPLIT_K": 4, "num_warps": 4, "num_stages": 4}
    block_m = 32 if M <= 32 else 64
    if M <= 64 and N < 65536:
        if N <= 4096:
            return {"BLOCK_M": block_m, "BLOCK_N": 16, "BLOCK_K": 512, "SPLIT_K": 4, "num_warps": 4, "num_stages": 4}
        if M <= 32:
            return {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 256, "SPLIT_K": 4, "num_warps": 4, "num_stages": 3}
        return {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4}
    block_n = 128
    while block_n > 16 and triton.cdiv(N, block_n) * triton.cdiv(M, block_m) < 2 * num_sms:
        block_n //= 2
    if block_n >= 64:
        return {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": 128, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3}
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": 256, "SPLIT_K": 4, "num_warps": 4, "num_stages": 3}


def nvfp4_gemm_triton(
    x: Tensor, weight: Tensor, weight_scale: Tensor, weight_scale_2: Tensor, config: dict | None = None,
    launch: Launch = DEFAULT_LAUNCH,
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
    if weight.stride(1) != 1 or weight.stride(0) % 2 or weight.data_ptr() % 2:
        raise ValueError("NVFP4 weight rows must be contiguous and 2-byte aligned (the GPU path reads int16 words)")
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    y = torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
    if M == 0:
        return y.reshape(*x.shape[:-1], N)
    g = weight_scale_2.to(device=x.device, dtype=torch.float32).reshape(1)
    # Triton's E4M3 type, the PTX path's scale conversion, needs sm_89+; older GPUs unpack with integers
    ptx = x.device.type == "cuda" and capability(x.device.index) >= (8, 9) and Launch.NVFP4_PTX in launch
    invariant = Launch.INVARIANT in launch  # every row count takes the 16-row tiles of a one-row call, no GEMV
    if M == 1 and config is None and not invariant and Launch.NVFP4_GEMV in launch and x2.data_ptr() % 8 == 0:
        nvfp4_gemv_launch(x2, weight, weight_scale, g, y, ptx, pdl_args(x.device, launch))  # x read as int64 words
        return y.reshape(*x.shape[:-1], N)
    cfg = {"SPLIT_K": 1, "SLICES": 1, **(config or default_config(1 if invariant else M, N))}
    if cfg["SLICES"] < 1:
        raise ValueError(f"nvfp4_gemm config SLICES={cfg['SLICES']}: K is cut over 1 or more programs")
    grid = (triton.cdiv(N, cfg["BLOCK_N"]), triton.cdiv(M, cfg["BLOCK_M"]), cfg["SLICES"])
    k_slice = triton.cdiv(triton.cdiv(K, cfg["SLICES"]), cfg["BLOCK_K"]) * cfg["BLOCK_K"]
    tiles = grid[0] * grid[1]
    ws, count = scratch(x.device, tiles * cfg["SLICES"] * cfg["BLOCK_N"] * cfg["BLOCK_M"], tiles) \
        if cfg["SLICES"] > 1 else (g, g)
    _nvfp4_gemm_kernel[grid](
        x2.view(torch.int16), weight, weight_scale.view(torch.uint8), g, y.view(torch.int16), ws, count,
        M, N, K, k_slice, x2.stride(0), weight.stride(0), weight_scale.stride(0), y.stride(0),
        EVEN_K=K % cfg["BLOCK_K"] == 0, PTX_DEQUANT=ptx, DOT_F32=x.device.type != "cuda", **cfg,
        **pdl_args(x.device, launch),
    )
    return y.reshape(*x.shape[:-1], N)
