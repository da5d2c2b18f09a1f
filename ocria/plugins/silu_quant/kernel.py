"""Triton kernel: one pass over ``gate_up`` that writes the quantized input of ``down_proj``.

In the CPU interpreter every rounding is spelled out in integer/fp32 arithmetic that mirrors
``ocria.plugins.numerics`` (IEEE ``div_rn``, round-half-even through ``+2^23 - 2^23``, E4M3/E2M1
bytes built by hand), because the interpreter's bf16 and fp8 casts do not round to nearest even.

On the GPU the quantized modes are compute-bound (instruction issue, and the quarter-rate unit that runs ``ex2``,
``rcp`` and converts), so each step takes the cheapest instructions that still give PyTorch's bytes:
- the bf16 silu (``fast_silu``): ``ex2.approx`` and ``rcp.approx`` instead of ``expf`` and an IEEE division, both
  elements of a pair rounded by one ``cvt.rn.bf16x2.f32`` and multiplied by ``mul.rn.bf16x2`` (``_SILU_MUL_BF16X2``).
  Not IEEE, but with 65536 bf16 inputs the check is complete: it gives PyTorch's bf16 for every gate value and
  every up value on the H200 (``python -m bench.ops.run --op silu_quant`` times the IEEE silu if not). 47 -> 17
  SASS instructions per element in bf16 mode. fp16 and fp32 inputs, for which no such check is complete,
  take libdevice's ``expf`` (PyTorch's) and an IEEE division whatever ``fast_silu`` says: an approximate exp there
  missed PyTorch's bytes on the H200;
- quotients by a scale (NVFP4 block scales; FP8 scales in [2^-64, 2^119]): a multiply by the correctly rounded
  reciprocal plus one FMA correction (exact by Markstein's theorem);
- E4M3 bytes: PTX's single-rounding ``cvt.rn.satfinite.e4m3x2.f32`` of |h| / scale, the sign put back from h's bits
  (``fp8_codes.e4m3_cvt``); E2M1 codes read their rounded integers from the mantissa bits of a sum with 2^22, 2^23
  or 2^24 by binade, no float-to-int convert;
- NaN rows and blocks: a NaN-keeping amax (``fp8_codes.abs_max``), not a second reduction over NaN flags.
Two simpler builds gave wrong bytes: Triton's ``tl.float8e4nv`` convert goes through fp16 (midpoints rounded down),
and an E4M3 byte from a signed quotient loses the sign of -0, since Triton negates by subtracting from +0.

NVFP4 has its own kernel (``_nvfp4_kernel``): a thread holds one 16-element block, read as pair words, so amax, block
scale and divisor are per thread, and programs walk tiles of blocks with the next tile's loads in flight.

Per-token FP8 needs a row's amax before its first byte. Rows up to 32768 wide are held in registers by
``_token_fp8_row_kernel`` (one pass: h computed once); wider ones walk the row twice in ``_silu_mul_quant_kernel``.
"""

import struct

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra import libdevice
from triton.runtime.interpreter import InterpretedFunction

from ocria.errors import OcriaError
from ocria.plugins.fp8_codes import abs_max, e4m3_bytes, e4m3_code, max_nan, quotient, scale_of, token_scale
from ocria.plugins.launch import pdl_args, pdl_enter, sm_count
from ocria.plugins.numerics import NVFP4_BLOCK
from ocria.plugins.policy import DEFAULT_LAUNCH, Launch
from ocria.plugins.rounding import round_to_dtype, widen

MODE_IDS = {"bf16": 0, "fp8_static": 1, "fp8_dynamic": 2, "nvfp4": 3}


# E2M1 codes without a case per binade: for q in [0, 6 + 1 ulp], e = max(q's exponent field, 127) (127: q < 2,
# 128: [2, 4), 129: [4, 6]) and one rounding add q + 2^(e + 22) rounds q to halves, units or twos, as E2M1 spaces its
# values there; the code is bits(q + 2^(e + 22)) + (2 - 2^23) e + E2M1_BIAS (the count of ulps above the magic number
# plus 0, 2 or 4), plus 8 for the sign. The bias is added once per word of eight codes (E2M1_WORD_BIAS); on the GPU
# the rest is one instruction per step and a predicated add for the sign (in Triton ops LLVM splits the
# multiply-add into shifts and adds, and the sign into an add and a select).
E2M1_BIAS = -(22 << 23) - 254
E2M1_WORD_BIAS = tl.constexpr((E2M1_BIAS * 0x11111111) % (1 << 32))  # 0x56111122: fits int32
_E2M1_UNBIASED = tl.constexpr("""{
.reg .b32 e, m;
.reg .pred p;
shr.u32 e, $1, 23;
max.u32 e, e, 127;
shl.b32 m, e, 23;
add.s32 m, m, 0x0B000000;
add.f32 m, $1, m;
mad.lo.s32 $0, e, -8388606, m;
setp.lt.f32 p, $2, 0f00000000;
@p add.s32 $0, $0, 8;
}""")


@triton.jit
def _e2m1_unbiased(q, sign_of, ON_GPU: tl.constexpr):
    """E2M1 code of q in [0, 6 + 1 ulp] (RNE on {0, .5, 1, 1.5, 2, 3, 4, 6}) less E2M1_BIAS, as int32, with the
    sign bit where ``sign_of`` < 0."""
    if ON_GPU:
        return tl.inline_asm_elementwise(_E2M1_UNBIASED, "=r,r,f", [q.to(tl.int32, bitcast=True), sign_of],
                                         dtype=tl.int32, is_pure=True, pack=1)
    e = tl.maximum(q.to(tl.int32, bitcast=True) >> 23, 127)
    y = q + ((e << 23) + (22 << 23)).to(tl.float32, bitcast=True)
    return y.to(tl.int32, bitcast=True) + e * (2 - (1 << 23)) + tl.where(sign_of < 0.0, 8, 0)


@triton.jit
def _e2m1_nibbles(h, denom, inv, ON_GPU: tl.constexpr, NONZERO: tl.constexpr):
    """E2M1 codes of h / denom less E2M1_BIAS, sign included. The sign follows ModelOpt's ``t < 0`` for
    t = RN(h / denom): h negative and t not rounded to zero, which ``NONZERO`` promises for every nonzero h (bf16 /
    fp16 h and divisors below 2^15). The quotient stays in E2M1's range with |h| clamped at 6 x denom
    (RN(6 denom) / denom rounds to at most 6 + 1 ulp, which rounds to 6 as any larger quotient would)."""
    q = quotient(tl.abs(h), denom, inv, denom * 6.0, ON_GPU, NEG_S=True)
    return _e2m1_unbiased(q, h if NONZERO else tl.where(q > 0.0, h, 0.0), ON_GPU)


@triton.jit
def _e2m1_word(even, odd, denom, inv, ON_GPU: tl.constexpr, NONZERO: tl.constexpr):
    """[B, 4] even and odd elements of half an NVFP4 block (divisor ``denom`` [B, 1], its reciprocal ``inv``) ->
    [B] int32 of their eight E2M1 codes, element k in bits 4k..4k+3 (the bytes' order in memory: low nibble = even
    element). The caller overwrites the words of NaN blocks."""
    B: tl.constexpr = even.shape[0]
    byte = (_e2m1_nibbles(even, denom, inv, ON_GPU, NONZERO)  # shift-adds: the nibbles' biases add up to the word's
            + (_e2m1_nibbles(odd, denom, inv, ON_GPU, NONZERO) << 4))
    b02, b13 = tl.split(tl.reshape(byte, [B, 2, 2]))
    half0, half1 = tl.split(b02 + (b13 << 8))
    return half0 + (half1 << 16) + E2M1_WORD_BIAS


# The bf16 silu on the GPU (``fast_silu``), two elements per asm block: e = 2^(-g log2 e) by ``ex2.approx`` (libdevice's
# fast_expf), g / (1 + e) as (g / 4) * rcp.approx((1 + e) / 4) (the quarter keeps the reciprocal of a huge 1 + e,
# g near -88, a normal number), both rounded to bf16 by one ``cvt.rn.bf16x2.f32``, then times up by ``mul.rn.bf16x2``:
# its one rounding of the exact product of two bf16 values is the fp32 product's rounding to bf16. Not an IEEE
# quotient, but the bf16 it rounds to is PyTorch's for every one of the 65536 bf16 gate values (and the product
# PyTorch's for every bf16 up value), checked on the H200: with 65536 inputs that is complete.
_SILU_BF16X2_BODY = """
.reg .f32 g0, g1, e0, e1, r0, r1;
.reg .b32 sp;
shl.b32 g0, {g}, 16;
and.b32 g1, {g}, 0xffff0000;
mul.f32 e0, g0, 0fBFB8AA3B;
mul.f32 e1, g1, 0fBFB8AA3B;
ex2.approx.ftz.f32 e0, e0;
ex2.approx.ftz.f32 e1, e1;
fma.rn.f32 e0, e0, 0f3E800000, 0f3E800000;
fma.rn.f32 e1, e1, 0f3E800000, 0f3E800000;
rcp.approx.ftz.f32 r0, e0;
rcp.approx.ftz.f32 r1, e1;
mul.f32 g0, g0, 0f3E800000;
mul.f32 g1, g1, 0f3E800000;
mul.f32 g0, g0, r0;
mul.f32 g1, g1, r1;
cvt.rn.bf16x2.f32 sp, g1, g0;
mul.rn.bf16x2 {h}, sp, {u};
"""
_SILU_MUL_BF16X2 = tl.constexpr("{\n.reg .b32 hp;" + _SILU_BF16X2_BODY.format(g="$2", u="$3", h="hp")
                                + "shl.b32 $0, hp, 16;\nand.b32 $1, hp, 0xffff0000;\n}")
_SILU_MUL_PACKED = tl.constexpr("{" + _SILU_BF16X2_BODY.format(g="$1", u="$2", h="$0") + "}")


@triton.jit
def _silu_mul_bf16x2(g, u):
    """h = bf16(bf16(silu(g)) * u) as fp32 for bf16 g, u given as int16 bits (GPU only)."""
    return tl.inline_asm_elementwise(_SILU_MUL_BF16X2, "=f,=f,r,r", [g, u], dtype=tl.float32, is_pure=True, pack=2)


@triton.jit
def _silu_mul_pairs(g2, u2):
    """(h of the even element, h of the odd) for int32 words of two bf16 gate / up values (GPU only)."""
    return tl.inline_asm_elementwise(_SILU_MUL_BF16X2, "=f,=f,r,r", [g2, u2], dtype=(tl.float32, tl.float32),
                                     is_pure=True, pack=1)


@triton.jit
def _silu_mul_packed(g2, u2):
    """bf16x2 words of h (even element low) for int32 words of two bf16 gate / up values (GPU only)."""
    return tl.inline_asm_elementwise(_SILU_MUL_PACKED, "=r,r,r", [g2, u2], dtype=tl.int32, is_pure=True, pack=1)


# NVFP4 codes of bf16 h without a quotient (GPU, global scales in [2^-60, 64]): ModelOpt's code is
# code(RN(|h| / d)), and code(q) >= k exactly when q >= b_k (ties going up to an even code) or q > b_k (ties going
# down), b = 0.25 (>), 0.75 (>=), 1.25 (>), 1.75 (>=), 2.5 (>), 3.5 (>=), 5 (>). RN(x) >= b holds for x at or above
# the midpoint below b, RN(x) > b for x above the midpoint over b: |h| / d >= m_k with m_k = b_k -+ half an fp32 ulp.
# d m_k is never a bf16 value (the odd part of m_k has 25 bits, a bf16 value's at most 8), so for bf16 |h| that is
# |h| > F_k with F_k the largest bf16 below d m_k: floor_bf16(RD(d m_k)), the product by one fma.rm of d, b_k and the
# exact d (m_k - b_k), the floor by cvt.rz.bf16x2, which also puts F_k in both halves of a word. The code is then
# the number of F_k below |h|: three bf16x2 compares of a binary search per pair of elements, no fp32 arithmetic.
# (b_k, m_k - b_k) for k = 1..7: the decision points and the offsets of the midpoints that decide them
E2M1_DECISIONS = ((0.25, 2.0**-26), (0.75, -(2.0**-25)), (1.25, 2.0**-24), (1.75, -(2.0**-24)), (2.5, 2.0**-23),
                  (3.5, -(2.0**-23)), (5.0, 2.0**-22))


def _ptx_f32(value: float) -> str:
    return f"0f{struct.unpack('<I', struct.pack('<f', value))[0]:08X}"


_NVFP4_FLOORS = tl.constexpr("{\n.reg .f32 c, p;\n" + "".join(
    f"mul.f32 c, $7, {_ptx_f32(off)};\nfma.rm.f32 p, $7, {_ptx_f32(b)}, c;\ncvt.rz.bf16x2.f32 ${k}, p, p;\n"
    for k, (b, off) in enumerate(E2M1_DECISIONS)) + "}")


def _e2m1_pair_asm(pair: str, dest: str, first: bool, even_bit: int, odd_bit: int) -> str:
    """PTX for the two E2M1 codes of the bf16x2 word ``pair`` (floors F_1..F_7 in $5..$11), or'ed into ``dest``:
    the even element's code at bit ``even_bit``, the odd one's at ``odd_bit`` (>= 16), each with its sign at + 3."""
    def at(k: int) -> str:
        return f"0x{(1 << (odd_bit + k)) | (1 << (even_bit + k)):08X}"
    return f"""and.b32 a, {pair}, 0x7FFF7FFF;
set.gt.u32.bf16x2 m1, a, $8;
lop3.b32 t, m1, $10, $6, 0xCA;
set.gt.u32.bf16x2 m2, a, t;
lop3.b32 x, m1, $11, $7, 0xCA;
lop3.b32 y, m1, $9, $5, 0xCA;
lop3.b32 t, m2, x, y, 0xCA;
set.gt.u32.bf16x2 m3, a, t;
set.lt.u32.bf16x2 s, {pair}, z;
{"and.b32 " + dest + ", m1, " + at(2) if first else "lop3.b32 " + dest + ", m1, " + at(2) + ", " + dest + ", 0xEA"};
lop3.b32 {dest}, m2, {at(1)}, {dest}, 0xEA;
lop3.b32 {dest}, m3, {at(0)}, {dest}, 0xEA;
lop3.b32 {dest}, s, {at(3)}, {dest}, 0xEA;
"""


# Eight E2M1 codes from four bf16x2 words of h ($1..$4, elements 0..7) and the block's floors ($5..$11): the codes
# of words 0 and 1 go to bits 0, 20, 8, 28 of c01 (a compare's mask covers its element's half of the word), so that
# c01 + (c01 >> 16) holds elements 0..3 in its low 16 bits, in order; words 2 and 3 likewise; one prmt joins them.
# lop3 0xCA is a ? b : c, 0xEA is (a & b) | c.
_E2M1_PACKED_WORD = tl.constexpr("""{
.reg .b32 a, m1, m2, m3, s, t, x, y, z, c01, c23;
mov.b32 z, 0;
""" + _e2m1_pair_asm("$1", "c01", True, 0, 20) + _e2m1_pair_asm("$2", "c01", False, 8, 28)
    + _e2m1_pair_asm("$3", "c23", True, 0, 20) + _e2m1_pair_asm("$4", "c23", False, 8, 28) + """shr.b32 t, c01, 16;
add.s32 c01, c01, t;
shr.b32 t, c23, 16;
add.s32 c23, c23, t;
prmt.b32 $0, c01, c23, 0x5410;
}""")


@triton.jit
def _nvfp4_packed_tile(hp0, hp1, scale, inv_s6):
    """(amax [B], E4M3 scale codes [B], [B, 2] int32 code words) of a tile's blocks from the bf16x2 words of their h
    ([B, 4] each half; GPU, global scale in [2^-60, 64]). The amax is an unsigned 16-bit max of |h|'s bits (NaN
    bits above inf's, so a NaN wins), exact for subnormal h too."""
    B: tl.constexpr = hp0.shape[0]
    m = _max_u16x2(hp0 & 0x7FFF7FFF, hp1 & 0x7FFF7FFF)
    m01, m23 = tl.split(tl.reshape(m, [B, 2, 2]))
    m = _max_u16x2(m01, m23)
    m0, m1 = tl.split(m)
    m = _max_u16x2(m0, m1)
    bamax = tl.maximum(m << 16, m & -65536).to(tl.float32, bitcast=True)
    scode, denom, _ = _nvfp4_block_scales(bamax, scale, inv_s6, True)
    floors = tl.inline_asm_elementwise(_NVFP4_FLOORS, "=r,=r,=r,=r,=r,=r,=r,f", [denom], dtype=(tl.int32,) * 7,
                                       is_pure=True, pack=1)
    return bamax, scode, tl.join(_e2m1_packed_word(hp0, floors), _e2m1_packed_word(hp1, floors))


@triton.jit
def _max_u16x2(a, b):
    return tl.inline_asm_elementwise("max.u16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _e2m1_packed_word(hp, floors):
    """[B] int32 of the eight E2M1 codes of [B, 4] bf16x2 words of h, element k in bits 4k..4k+3."""
    B: tl.constexpr = hp.shape[0]
    p02, p13 = tl.split(tl.reshape(hp, [B, 2, 2]))
    p0, p2 = tl.split(p02)
    p1, p3 = tl.split(p13)
    f1, f2, f3, f4, f5, f6, f7 = floors
    return tl.inline_asm_elementwise(_E2M1_PACKED_WORD, "=r" + ",r" * 11, [p0, p1, p2, p3, f1, f2, f3, f4, f5, f6, f7],
                                     dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _rcp(d):
    """1/d as the IEEE division's fast path has it before its final quotient: ``rcp.approx`` and one Newton step.
    ``quotient`` with it is that fast path, correctly rounded where its operands need no range fix-up (GPU only)."""
    y = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [d], dtype=tl.float32, is_pure=True, pack=1)
    return tl.fma(y, tl.fma(-d, y, 1.0), y)


@triton.jit
def _nvfp4_block_scales(bamax, scale, inv_s6, ON_GPU: tl.constexpr):
    """(E4M3 scale codes, fp32 divisors, their reciprocals) of NVFP4 blocks with amax ``bamax`` (NaN for a block with
    a NaN: code 0x7F, NaN divisor) under the global ``scale``: code of clamp(RN(amax / (6 scale)), 2^-9, 448), 1 for
    an all-zero block. On the GPU, for global scales in [2^-60, 64], the quotient and the reciprocal are the IEEE
    division's fast path without its range check (``inv_s6``: ``_rcp(6 scale)``, once per program): operands there
    stay clear of overflow, and a quotient under 2^-9 is clamped anyway (a zero one comes only from a zero amax);
    other scales divide."""
    s6 = 6.0 * scale
    fast = (scale >= 8.673617379884035e-19) & (scale <= 64.0)
    if ON_GPU and fast:
        sc = quotient(bamax, s6, inv_s6, s6 * 896.0, ON_GPU)
    else:
        sc = tl.math.div_rn(bamax, tl.zeros_like(bamax) + s6)
    sc = tl.minimum(tl.maximum(tl.where(sc == 0.0, 1.0, sc), 0.001953125), 448.0)
    scode, sc8 = e4m3_code(sc)
    bnan = bamax != bamax
    denom = tl.where(bnan, float("nan"), sc8 * scale)
    if ON_GPU and fast:
        inv = _rcp(denom)
    else:
        inv = tl.math.div_rn(tl.full(denom.shape, 1.0, tl.float32), denom)
    return tl.where(bnan, 0x7F, scode), denom, inv


@triton.jit
def _activation_of(g, u, GATED: tl.constexpr, IS_BF16: tl.constexpr, ON_GPU: tl.constexpr, FAST_SILU: tl.constexpr,
                   DT: tl.constexpr):
    """h = silu(gate) * up (GATED) or x itself, in fp32, each op rounded to x's dtype as PyTorch rounds it."""
    if GATED:
        if ON_GPU and IS_BF16 and FAST_SILU:
            return _silu_mul_bf16x2(g, u)
        g = widen(g, IS_BF16)
        u = widen(u, IS_BF16)
        if ON_GPU:  # libdevice expf is what PyTorch's CUDA exp calls; the approximate silu is proven for bf16 only
            e = libdevice.exp(-g)
        else:
            e = tl.exp(-g)
        s = round_to_dtype(tl.math.div_rn(g, 1.0 + e), IS_BF16, ON_GPU, DT)
        return round_to_dtype(s * u, IS_BF16, ON_GPU, DT)
    else:
        return widen(g, IS_BF16)


@triton.jit
def _activation(x_ptr, x_offs, mask, N, GATED: tl.constexpr, IS_BF16: tl.constexpr, ON_GPU: tl.constexpr,
                FAST_SILU: tl.constexpr, DT: tl.constexpr):
    """``_activation_of`` the gate and up loaded at ``x_offs`` (masked lanes load 0)."""
    g = tl.load(x_ptr + x_offs, mask=mask, other=0)
    u = tl.load(x_ptr + x_offs + N, mask=mask, other=0) if GATED else g
    return _activation_of(g, u, GATED, IS_BF16, ON_GPU, FAST_SILU, DT)


@triton.jit
def _silu_mul_quant_kernel(
    x_ptr, out_ptr, scale_ptr, out_scale_ptr,
    M, N, stride_xm, stride_om, stride_sm,
    MODE: tl.constexpr, GATED: tl.constexpr, IS_BF16: tl.constexpr, ON_GPU: tl.constexpr,
    FAST_SILU: tl.constexpr, NPASS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_CHUNKS: tl.constexpr, PDL: tl.constexpr,
):
    # MODE: 0 plain, 1 fp8 static, 2 fp8 per-token dynamic (NVFP4 has its own kernel). IS_BF16: x (and the bf16
    # output) travel as int16 bits, widened by a shift, exactly, also for subnormals where the interpreter's
    # bf16 <-> fp32 conversions are wrong. MODE 2 with NPASS 2 walks its row twice (amax, then bytes); with
    # NPASS 1 the whole row is one tile (NUM_CHUNKS 1) and h is computed once.
    pdl_enter(PDL)
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    rows64 = rows.to(tl.int64)
    col_start = pid_n * (BLOCK_N * NUM_CHUNKS)
    DT: tl.constexpr = tl.bfloat16 if IS_BF16 else x_ptr.dtype.element_ty
    scale = 1.0
    if MODE == 1:
        scale = tl.load(scale_ptr)
    amax = tl.zeros([BLOCK_M], dtype=tl.float32)  # NaN-keeping: a row with a NaN gets a NaN scale
    row_scale = tl.zeros([BLOCK_M], dtype=tl.float32) + scale
    for p in tl.static_range(NPASS):
        for chunk in range(NUM_CHUNKS):
            cols = col_start + chunk * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = rmask[:, None] & (cols < N)[None, :]
            h32 = _activation(x_ptr, rows64[:, None] * stride_xm + cols[None, :], mask, N, GATED, IS_BF16, ON_GPU,
                              FAST_SILU, DT)
            if p == NPASS - 1:
                o_offs = rows64[:, None] * stride_om + cols[None, :]
                if MODE == 0:
                    if IS_BF16:
                        h = (h32.to(tl.int32, bitcast=True) >> 16).to(tl.int16)
                    else:
                        h = h32.to(out_ptr.dtype.element_ty)
                    tl.store(out_ptr + o_offs, h, mask=mask)
                else:
                    if MODE == 2 and NPASS == 1:  # the row is this one tile: its scale first
                        row_scale = token_scale(h32, mask)
                        tl.store(out_scale_ptr + rows64 * stride_sm, row_scale, mask=rmask)
                    tl.store(out_ptr + o_offs, e4m3_bytes(h32, row_scale, ON_GPU), mask=mask)
            else:
                amax = _row_amax(tl.where(mask, h32, 0.0), amax)
        if p == 0 and NPASS == 2:
            row_scale = scale_of(amax)
            tl.store(out_scale_ptr + rows64 * stride_sm, row_scale, mask=rmask)


@triton.jit
def _nvfp4_loads(x_ptr, tile, M, stride_xm, N: tl.constexpr, GATED: tl.constexpr, BLOCKS: tl.constexpr):
    """Gate and up of the blocks of ``tile`` (BLOCKS consecutive 16-element blocks of the [M, N / 16] grid of
    blocks, across rows) as pair words (``x_ptr``: two elements per word, ``stride_xm`` in words), two [BLOCKS, 4]
    halves each. Lanes past the end load the last block again (no masks: no predicated loads, no zeroed
    registers); their results are never stored, and every lane is a block of its own."""
    NB: tl.constexpr = N // 16
    blk = tl.minimum(tile * BLOCKS + tl.arange(0, BLOCKS), M * NB - 1)
    row = blk // NB  # N is a constexpr: a multiply-high
    offs = (row.to(tl.int64) * stride_xm + (blk - row * NB) * 8)[:, None] + tl.arange(0, 4)[None, :]
    g0 = tl.load(x_ptr + offs)
    g1 = tl.load(x_ptr + offs + 4)
    if GATED:
        return g0, tl.load(x_ptr + offs + N // 2), g1, tl.load(x_ptr + offs + (4 + N // 2))
    return g0, g0, g1, g1


@triton.jit
def _pair_elements(w, KIND: tl.constexpr):
    """(even, odd) elements of pair words: bf16 as int16 bits (KIND 0), fp16 (1), fp32 (2, from int64 words).
    One return: Triton's code generator checks every return it reaches, constexpr branches taken or not."""
    if KIND == 2:
        even, odd = w.to(tl.int32).to(tl.float32, bitcast=True), (w >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    else:
        even, odd = w.to(tl.int16), (w >> 16).to(tl.int16)
        if KIND == 1:
            even, odd = even.to(tl.float16, bitcast=True), odd.to(tl.float16, bitcast=True)
    return even, odd


@triton.jit
def _pair_activation(g2, u2, GATED: tl.constexpr, KIND: tl.constexpr, ON_GPU: tl.constexpr, FAST_SILU: tl.constexpr):
    """(h of the even elements, h of the odd) of pair words, as ``_activation_of`` computes h."""
    if GATED and KIND == 0 and ON_GPU and FAST_SILU:
        return _silu_mul_pairs(g2, u2)
    DT: tl.constexpr = tl.bfloat16 if KIND == 0 else tl.float16 if KIND == 1 else tl.float32
    g_even, g_odd = _pair_elements(g2, KIND)
    u_even, u_odd = _pair_elements(u2, KIND)
    return (_activation_of(g_even, u_even, GATED, KIND == 0, ON_GPU, FAST_SILU, DT),
            _activation_of(g_odd, u_odd, GATED, KIND == 0, ON_GPU, FAST_SILU, DT))


@triton.jit
def _nvfp4_tile_scales(even0, odd0, even1, odd1, scale, inv_s6, ON_GPU: tl.constexpr):
    """(amax [B], E4M3 scale codes [B], divisors [B, 1], their reciprocals [B, 1]) of a tile's blocks from the h
    of their two halves (``_pair_activation``'s even and odd elements, [B, 4] each)."""
    bamax = max_nan(max_nan(abs_max(even0, 1), abs_max(odd0, 1)), max_nan(abs_max(even1, 1), abs_max(odd1, 1)))
    scode, denom, inv = _nvfp4_block_scales(bamax, scale, inv_s6, ON_GPU)
    return bamax, scode, denom[:, None], inv[:, None]


@triton.jit
def _nvfp4_tile_words(even0, odd0, even1, odd1, denom, inv, ON_GPU: tl.constexpr, NONZERO: tl.constexpr):
    """[B, 2] int32: the packed E2M1 codes of each block's two halves (the caller overwrites NaN blocks)."""
    return tl.join(_e2m1_word(even0, odd0, denom, inv, ON_GPU, NONZERO),
                   _e2m1_word(even1, odd1, denom, inv, ON_GPU, NONZERO))


@triton.jit
def _nvfp4_tile(g0, u0, g1, u1, scale, inv_s6, nonzero, GATED: tl.constexpr, KIND: tl.constexpr,
                ON_GPU: tl.constexpr, FAST_SILU: tl.constexpr, PACKED: tl.constexpr):
    """(amax [B], E4M3 scale codes [B], [B, 2] int32 code words, NaN blocks' words 0x77777777) of a tile from its
    pair words. PACKED: bf16 h kept as bf16x2 words and coded against the block's floors (``_nvfp4_packed_tile``);
    otherwise h in fp32 and the quotient's E2M1 code, ``nonzero`` as ``_e2m1_nibbles``' NONZERO."""
    if PACKED:
        if GATED:
            hp0, hp1 = _silu_mul_packed(g0, u0), _silu_mul_packed(g1, u1)
        else:
            hp0, hp1 = g0, g1
        bamax, scode, words = _nvfp4_packed_tile(hp0, hp1, scale, inv_s6)
    else:
        even0, odd0 = _pair_activation(g0, u0, GATED, KIND, ON_GPU, FAST_SILU)
        even1, odd1 = _pair_activation(g1, u1, GATED, KIND, ON_GPU, FAST_SILU)
        bamax, scode, denom, inv = _nvfp4_tile_scales(even0, odd0, even1, odd1, scale, inv_s6, ON_GPU)
        if nonzero:
            words = _nvfp4_tile_words(even0, odd0, even1, odd1, denom, inv, ON_GPU, True)
        else:
            words = _nvfp4_tile_words(even0, odd0, even1, odd1, denom, inv, ON_GPU, False)
    return bamax, scode, tl.where((bamax != bamax)[:, None], 0x77777777, words)


@triton.jit
def _nvfp4_walk(x_ptr, out_ptr, out_scale_ptr, M, stride_xm, g0, u0, g1, u1, scale, inv_s6, nonzero,
                N: tl.constexpr, GATED: tl.constexpr, KIND: tl.constexpr, ON_GPU: tl.constexpr,
                FAST_SILU: tl.constexpr, BLOCKS: tl.constexpr, PACKED: tl.constexpr):
    """A program's tiles from its first tile's words, the next tile's loads issued before this tile's arithmetic."""
    pid = tl.program_id(0)
    n_tiles = tl.cdiv(M * (N // 16), BLOCKS)
    for tile in range(pid, n_tiles, tl.num_programs(0)):
        next_g0, next_u0, next_g1, next_u1 = _nvfp4_loads(x_ptr, tile + tl.num_programs(0), M, stride_xm, N, GATED,
                                                          BLOCKS)
        bamax, scode, words = _nvfp4_tile(g0, u0, g1, u1, scale, inv_s6, nonzero, GATED, KIND, ON_GPU, FAST_SILU,
                                          PACKED)
        blk = tile * BLOCKS + tl.arange(0, BLOCKS)
        bmask = blk < M * (N // 16)
        tl.store(out_scale_ptr + blk, scode.to(tl.uint8), mask=bmask)
        tl.store(out_ptr + blk[:, None] * 2 + tl.arange(0, 2)[None, :], words, mask=bmask[:, None])
        g0, u0, g1, u1 = next_g0, next_u0, next_g1, next_u1


@triton.jit
def _nvfp4_kernel(
    x_ptr, out_ptr, scale_ptr, out_scale_ptr, M, stride_xm, N: tl.constexpr,
    GATED: tl.constexpr, KIND: tl.constexpr, ON_GPU: tl.constexpr, FAST_SILU: tl.constexpr,
    BLOCKS: tl.constexpr, PDL: tl.constexpr,
):
    # NVFP4, one thread per 16-element block: the block is loaded as two halves of four pair words (two elements
    # per 32-bit word for bf16 / fp16, ``KIND`` 0 / 1; per 64-bit word for fp32, 2), so a thread holds all of its
    # block and amax, block scale and divisor are computed once per block, in-thread (no shuffle, no duplicate work,
    # no layout change before the scale byte's store), and the even and odd elements come apart as the two halves
    # of a word, as the packed nibbles want them. A tile is BLOCKS consecutive blocks of the [M, N / 16] grid of
    # blocks, across rows, so no program is part-empty at row ends. Programs walk their tiles with the next tile's
    # loads issued before this tile's arithmetic: its memory time overlaps this tile's instructions, which a launch
    # of one program per tile, all loading and then all computing, does not; 32-bit words keep the loads in flight
    # in whole registers (16-bit elements were repacked at every iteration of the loop). Outputs are
    # contiguous: ``out_ptr`` the packed codes as int32 words, eight codes each, two per block; a NaN block is 0x77
    # bytes throughout. bf16 h on the GPU under a global scale in [2^-60, 64] (every calibrated one) stays in bf16x2
    # words and is coded by compares (``_NVFP4_FLOORS``); other inputs and scales divide in fp32.
    pdl_enter(PDL)
    # the first tile's loads go out before anything waits for the scale (the path taken depends on it)
    g0, u0, g1, u1 = _nvfp4_loads(x_ptr, tl.program_id(0), M, stride_xm, N, GATED, BLOCKS)
    scale = tl.load(scale_ptr)
    # bf16 / fp16 h is 0 or >= 2^-133 in magnitude: divided by at most 448 x 64 it cannot round to zero
    nonzero = (KIND != 2) & (scale <= 64.0)
    inv_s6 = _rcp(6.0 * scale) if ON_GPU else 0.0  # the interpreter divides
    if ON_GPU and KIND == 0 and (FAST_SILU or not GATED):
        if (scale >= 8.673617379884035e-19) & (scale <= 64.0):
            _nvfp4_walk(x_ptr, out_ptr, out_scale_ptr, M, stride_xm, g0, u0, g1, u1, scale, inv_s6, nonzero, N, GATED,
                        KIND, ON_GPU, FAST_SILU, BLOCKS, True)
        else:
            _nvfp4_walk(x_ptr, out_ptr, out_scale_ptr, M, stride_xm, g0, u0, g1, u1, scale, inv_s6, nonzero, N, GATED,
                        KIND, ON_GPU, FAST_SILU, BLOCKS, False)
    else:
        _nvfp4_walk(x_ptr, out_ptr, out_scale_ptr, M, stride_xm, g0, u0, g1, u1, scale, inv_s6, nonzero, N, GATED,
                    KIND, ON_GPU, FAST_SILU, BLOCKS, False)


@triton.jit
def _row_tile(x_ptr, row_off, START: tl.constexpr, W: tl.constexpr, N, GATED: tl.constexpr, IS_BF16: tl.constexpr,
              ON_GPU: tl.constexpr, FAST_SILU: tl.constexpr, DT: tl.constexpr):
    """h of columns [START, START + W) of one row, as a [1, W] tile (masked lanes load 0, so their h is 0)."""
    cols = START + tl.arange(0, W)
    return _activation(x_ptr, row_off + cols[None, :], (cols < N)[None, :], N, GATED, IS_BF16, ON_GPU, FAST_SILU, DT)


@triton.jit
def _row_amax(h, amax):
    return max_nan(amax, abs_max(h, 1))


@triton.jit
def _store_row_tile(out_ptr, out_off, h, row_scale, START: tl.constexpr, W: tl.constexpr, N, ON_GPU: tl.constexpr):
    cols = START + tl.arange(0, W)
    tl.store(out_ptr + out_off + cols[None, :], e4m3_bytes(h, row_scale, ON_GPU), mask=(cols < N)[None, :])


@triton.jit
def _token_fp8_row_kernel(
    x_ptr, out_ptr, out_scale_ptr, N, stride_xm, stride_om, stride_sm,
    GATED: tl.constexpr, IS_BF16: tl.constexpr, ON_GPU: tl.constexpr, FAST_SILU: tl.constexpr,
    W: tl.constexpr, NT: tl.constexpr, PDL: tl.constexpr,
):
    # Per-token FP8 in one pass, one program per row: the row's h is held in registers as NT (<= ROW_MAX_TILES)
    # tiles of W columns (only the last reaches past N), so the row is read and its silu computed once; its amax
    # gives the scale and the same registers give the bytes. Tiles of one width share one layout: |h| is maxed
    # across them element by element and reduced once (one barrier pair), and no tile's h changes layout on its
    # way to its store. Every tile's loads go out before that reduction: no load moves across its barrier.
    pdl_enter(PDL)
    DT: tl.constexpr = tl.bfloat16 if IS_BF16 else x_ptr.dtype.element_ty
    row = tl.program_id(0).to(tl.int64)
    x_off = row * stride_xm
    h0 = _row_tile(x_ptr, x_off, 0, W, N, GATED, IS_BF16, ON_GPU, FAST_SILU, DT)
    if NT > 1:
        h1 = _row_tile(x_ptr, x_off, W, W, N, GATED, IS_BF16, ON_GPU, FAST_SILU, DT)
    if NT > 2:
        h2 = _row_tile(x_ptr, x_off, 2 * W, W, N, GATED, IS_BF16, ON_GPU, FAST_SILU, DT)
    if NT > 3:
        h3 = _row_tile(x_ptr, x_off, 3 * W, W, N, GATED, IS_BF16, ON_GPU, FAST_SILU, DT)
    if NT > 4:
        h4 = _row_tile(x_ptr, x_off, 4 * W, W, N, GATED, IS_BF16, ON_GPU, FAST_SILU, DT)
    if NT > 5:
        h5 = _row_tile(x_ptr, x_off, 5 * W, W, N, GATED, IS_BF16, ON_GPU, FAST_SILU, DT)
    a = tl.abs(h0)
    if NT > 1:
        a = max_nan(a, tl.abs(h1))
    if NT > 2:
        a = max_nan(a, tl.abs(h2))
    if NT > 3:
        a = max_nan(a, tl.abs(h3))
    if NT > 4:
        a = max_nan(a, tl.abs(h4))
    if NT > 5:
        a = max_nan(a, tl.abs(h5))
    row_scale = scale_of(abs_max(a, 1))
    tl.store(out_scale_ptr + row * stride_sm + tl.arange(0, 1), row_scale)
    out_off = row * stride_om
    _store_row_tile(out_ptr, out_off, h0, row_scale, 0, W, N, ON_GPU)
    if NT > 1:
        _store_row_tile(out_ptr, out_off, h1, row_scale, W, W, N, ON_GPU)
    if NT > 2:
        _store_row_tile(out_ptr, out_off, h2, row_scale, 2 * W, W, N, ON_GPU)
    if NT > 3:
        _store_row_tile(out_ptr, out_off, h3, row_scale, 3 * W, W, N, ON_GPU)
    if NT > 4:
        _store_row_tile(out_ptr, out_off, h4, row_scale, 4 * W, W, N, ON_GPU)
    if NT > 5:
        _store_row_tile(out_ptr, out_off, h5, row_scale, 5 * W, W, N, ON_GPU)


ROW_MAX_TILES = 6  # tiles the row kernel spells out


def row_tiling(N: int, num_warps: int, tile_elems: int) -> tuple[int, int]:
    """(W, NT): tiles of ``tile_elems`` elements per thread (16 or 8: 32 or 16 bytes of gate per load) covering a
    row of N, for ``_token_fp8_row_kernel``."""
    if tile_elems not in (8, 16):
        raise ValueError(f"row tiles hold 8 or 16 elements per thread, got tile_elems={tile_elems}")
    width = tile_elems * 32 * num_warps
    tiles = triton.cdiv(N, width)
    if tiles > ROW_MAX_TILES:
        raise ValueError(f"a row of {N} needs {tiles} tiles of {width} columns, more than the row kernel's "
                         f"{ROW_MAX_TILES}: use more warps or 16 elements per thread")
    return width, tiles


def row_tile_elems(N: int, num_warps: int) -> int:
    """16 elements per thread unless 8 pads the row less (18944 columns, 16 warps: 20480 against 24576)."""
    pad = {e: triton.cdiv(N, e * 32 * num_warps) * e * 32 * num_warps for e in (16, 8)}
    return 8 if pad[8] < pad[16] and triton.cdiv(N, 8 * 32 * num_warps) <= ROW_MAX_TILES else 16


def _compiled(kernel, device: torch.device):
    """The compiled kernel on CUDA; on CPU the interpreter, which Triton only builds when
    ``TRITON_INTERPRET=1`` was set before ``triton`` itself was imported."""
    if device.type != "cuda" and not isinstance(kernel, InterpretedFunction):
        raise OcriaError("silu_mul_quant kernels on CPU need TRITON_INTERPRET=1 set before triton is imported")
    return kernel


# NVFP4 tiles: at most 128 blocks (4 warps), and at least 256 tiles where the tokens allow; programs walking them
# keep NVFP4_WARPS_PER_SM warps on each SM. ptxas builds the tile loop in 64 registers if left alone and then issues
# the next tile's loads at its end; capped at NVFP4_MAX_REGISTERS it takes 80 (24 warps per SM) and issues them
# about 80 instructions in (read off the SASS), which is what makes the loop's memory time overlap its
# arithmetic (timed on the H200 against the uncapped build)
NVFP4_MAX_BLOCKS = 128
NVFP4_MIN_TILES = 256
NVFP4_WARPS_PER_SM = 24
NVFP4_MAX_REGISTERS = 96

# Per-token FP8 row programs: a register cap that keeps 32 warps per SM resident, and the rows from which 8-warp
# launches take it (``default_config``).
ROW_MAX_REGISTERS = 64
CAPPED_FROM_ROWS = 1024


def default_config(mode: str, M: int, N: int) -> dict:
    """Rows x columns per program and warps, from a sweep at 4096 x 12288 on the H200
    (bf16 73.7 us and FP8 static 61.8, the best there), with the approximate bf16 silu, exact for every bf16 gate and
    up value in that run.

    NVFP4 (``_nvfp4_kernel``): one block per thread, 24 warps per SM (80 registers under the cap) walking the tiles,
    tiles of 128 blocks (4 warps, 6 programs per SM) where that still makes ``NVFP4_MIN_TILES`` tiles, halved down
    to 32 blocks (one warp) until it does (on the H200: at 1024 rows of 6144 / 12288 / 18944 8.88 / 16.01 / 23.30
    us, 4096 x 12288 56.73, against 8.92 / 15.97 / 23.35 / 57.15 with one-warp programs and 8.98 / 16.19 / 23.28 /
    56.50 with 8-warp ones; the loop left at 64 registers, 32 warps per SM, 9.90 us at 1024 x 6144; all with pooled
    outputs). With rotating outputs (the sweep at 1024 rows of 6144 / 12288): 9.40 / 16.13 us, 2-warp programs 9.31
    / 16.06, one-warp 9.45 / 16.08, 8-warp 9.52 / 16.38, uncapped 4-warp ones 10.27 / 17.37.

    Per-token FP8: the row held in registers by ``_token_fp8_row_kernel`` as equal tiles (16 or 8 elements per
    thread, whichever pads the row less), h computed once, with 8 warps up to 6144 columns and 16 above (on the
    H200: at 1024 rows 9.75 / 18.54 / 27.19 us for 6144 / 12288 / 18944 columns, against 11.07 / 20.11 / 27.18 with
    4 / 8 / 16 warps; at 4096 rows 32.33 / 61.94 / 93.63 against 34.50 / 63.61 / 93.49; 18944 with tiles of unequal
    widths: 34.0 us at 1024 rows, 115.1 at 4096). Registers capped at ``ROW_MAX_REGISTERS`` (32 warps per SM; a few
    bytes of spills): always at 16 warps, where a build at 121 registers ran 18944-wide rows at 163.7 us against
    116.6; at 8 warps from ``CAPPED_FROM_ROWS`` rows, where it pays (1024 x 6144 9.87 -> 9.75 us, 4096 x 6144 33.34
    -> 32.84) and not below (1 to 128 rows 2-4% slower with it at 4 and 8 warps). The best two-pass chunks took
    46.7, 87.9 and 162.0 us at 4096 rows. Rows wider than 32768 (timed only with an earlier build) walk their chunks
    twice, amax then bytes: 1024-column chunks with 4 warps from 1024 rows, 2048 with 8 below."""
    if mode == "fp8_dynamic":
        if N <= 32768:
            warps = 8 if N <= 6144 else 16
            cap = {"max_registers": ROW_MAX_REGISTERS} if warps == 16 or M >= CAPPED_FROM_ROWS else {}
            return {"row_tiles": True, "num_warps": warps, "fast_silu": True, **cap}
        if M >= 1024:
            return {"block_m": 1, "block_n": 1024, "num_warps": 4, "fast_silu": True}
        return {"block_m": 1, "block_n": 2048, "num_warps": 8, "fast_silu": True}
    if mode == "nvfp4":
        blocks = NVFP4_MAX_BLOCKS
        while blocks > 32 and M * (N // 16) < NVFP4_MIN_TILES * blocks:
            blocks //= 2
        return {"blocks": blocks, "num_warps": blocks // 32, "programs_per_sm": NVFP4_WARPS_PER_SM * 32 // blocks,
                "max_registers": NVFP4_MAX_REGISTERS, "fast_silu": True}
    widest = 1024 if mode == "fp8_static" else 2048
    block_n = widest if N >= widest else max(16, triton.next_power_of_2(N))
    return {"block_m": 1, "block_n": block_n, "num_warps": 8 if block_n >= 2048 else 4, "fast_silu": True}


def tiling(mode: str, N: int, config: dict) -> tuple[int, int, int]:
    """(columns per tile, tiles per program, passes) of a row of width N under ``config``: ``block_n`` 0 is
    the whole row; per-token FP8 walks its row's tiles in one program, twice when there is more than one."""
    block_n = config["block_n"] or max(16, triton.next_power_of_2(N))
    chunks = triton.cdiv(N, block_n) if mode == "fp8_dynamic" else 1
    return block_n, chunks, 2 if chunks > 1 else 1


def _launch_row_tiles(x: Tensor, out: Tensor, out_scale: Tensor, M: int, N: int, gated: bool, as_bits: bool,
                      cfg: dict, launch: Launch) -> None:
    warps = cfg["num_warps"]
    width, tiles = row_tiling(N, warps, cfg.get("tile_elems") or row_tile_elems(N, warps))
    cap = cfg.get("max_registers")
    dev = x.device
    _compiled(_token_fp8_row_kernel, dev)[(M,)](
        x, out, out_scale, N, x.stride(0), out.stride(0), out_scale.stride(0),
        GATED=gated, IS_BF16=as_bits, ON_GPU=dev.type == "cuda", FAST_SILU=cfg["fast_silu"],
        W=width, NT=tiles, num_warps=warps, **pdl_args(dev, launch), **({"maxnreg": cap} if cap else {}),
    )


def nvfp4_programs(M: int, N: int, cfg: dict, device: torch.device) -> int:
    """Programs of an NVFP4 launch under ``cfg``: ``programs_per_sm`` per SM walking the tiles (the interpreter counts
    one SM), or one per tile where it is 0 or absent."""
    tiles = triton.cdiv(M * (N // 16), cfg["blocks"])
    return min(tiles, cfg["programs_per_sm"] * sm_count(device)) if cfg.get("programs_per_sm") else tiles


def _launch_nvfp4(x: Tensor, out: Tensor, out_scale: Tensor, scale: Tensor, M: int, N: int, gated: bool,
                  cfg: dict, launch: Launch) -> None:
    blocks, dev, cap = cfg["blocks"], x.device, cfg.get("max_registers")
    grid = nvfp4_programs(M, N, cfg, dev)
    kind = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}.get(x.dtype)
    if kind is None:
        raise ValueError(f"NVFP4 activations from bf16, fp16 or fp32, got {x.dtype}")
    if x.stride(0) % 2 or x.storage_offset() % 2:  # pair words need rows at even offsets
        x = x.contiguous()
    words = x.view(torch.int64 if kind == 2 else torch.int32)
    _compiled(_nvfp4_kernel, dev)[(grid,)](
        words, out.view(torch.int32), scale, out_scale, M, words.stride(0), N=N,
        GATED=gated, KIND=kind, ON_GPU=dev.type == "cuda", FAST_SILU=cfg["fast_silu"], BLOCKS=blocks,
        num_warps=cfg["num_warps"], **pdl_args(dev, launch), **({"maxnreg": cap} if cap else {}),
    )


def _launch(x: Tensor, mode: str, scale: Tensor | None, gated: bool, config: dict | None = None,
            launch: Launch = DEFAULT_LAUNCH) -> tuple[Tensor, Tensor | None]:
    if mode not in MODE_IDS:
        raise ValueError(f"unknown activation quantization mode {mode!r}; expected one of {tuple(MODE_IDS)}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    lead, width = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, width)
    M = x2.shape[0]
    N = width // 2 if gated else width
    if gated and width % 2:
        raise ValueError(f"gate_up last dim must be even, got {width}")
    if mode == "nvfp4" and N % NVFP4_BLOCK:
        raise ValueError(f"NVFP4 needs a width that is a multiple of 16, got {N}")
    if mode in ("fp8_static", "nvfp4"):
        if scale is None:
            raise ValueError(f"mode {mode!r} needs a calibrated scale")
        scale = scale.to(device=x.device, dtype=torch.float32).reshape(1)
    dev = x.device
    out_scale = None
    if mode == "bf16":
        out = torch.empty(M, N, dtype=x.dtype, device=dev)
    elif mode in ("fp8_static", "fp8_dynamic"):
        out = torch.empty(M, N, dtype=torch.uint8, device=dev)
        if mode == "fp8_dynamic":
            out_scale = torch.empty(M, 1, dtype=torch.float32, device=dev)
    else:
        out = torch.empty(M, N // 2, dtype=torch.uint8, device=dev)
        out_scale = torch.empty(M, N // NVFP4_BLOCK, dtype=torch.uint8, device=dev)
    cfg = config or default_config(mode, M, N)
    as_bits = x.dtype == torch.bfloat16
    x_arg = x2.view(torch.int16) if as_bits else x2
    if M > 0 and mode == "nvfp4":
        if "blocks" not in cfg:
            raise ValueError(f"an nvfp4 config gives 'blocks' (16-element blocks per program), got {cfg}")
        _launch_nvfp4(x2, out, out_scale, scale, M, N, gated, cfg, launch)
    elif M > 0 and cfg.get("row_tiles"):
        if mode != "fp8_dynamic":
            raise ValueError(f"row_tiles configs are for mode 'fp8_dynamic', not {mode!r}")
        _launch_row_tiles(x_arg, out, out_scale, M, N, gated, as_bits, cfg, launch)
    elif M > 0:
        block_m = cfg["block_m"]
        block_n, chunks, passes = tiling(mode, N, cfg)
        grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n * chunks))
        out_arg = out.view(torch.int16) if as_bits and mode == "bf16" else out
        _compiled(_silu_mul_quant_kernel, dev)[grid](
            x_arg, out_arg, scale if scale is not None else out, out_scale if out_scale is not None else out,
            M, N, x2.stride(0), out.stride(0), out_scale.stride(0) if out_scale is not None else 0,
            MODE=MODE_IDS[mode], GATED=gated, IS_BF16=as_bits, ON_GPU=dev.type == "cuda", FAST_SILU=cfg["fast_silu"],
            NPASS=passes,
            BLOCK_M=block_m, BLOCK_N=block_n, NUM_CHUNKS=chunks, num_warps=cfg["num_warps"], **pdl_args(dev, launch),
        )
    if mode in ("fp8_static", "fp8_dynamic"):
        out = out.view(torch.float8_e4m3fn)
    out = out.reshape(*lead, out.shape[-1])
    if out_scale is not None:
        if out_scale.dtype == torch.uint8:
            out_scale = out_scale.view(torch.float8_e4m3fn)
        out_scale = out_scale.reshape(*lead, out_scale.shape[-1])
    return out, out_scale


def silu_mul_quant_triton(
    gate_up: Tensor, mode: str, scale: Tensor | None = None, config: dict | None = None,
    launch: Launch = DEFAULT_LAUNCH,
) -> tuple[Tensor, Tensor | None]:
    """Fused kernel; same contract as ``reference.silu_mul_quant_reference``."""
    return _launch(gate_up, mode, scale, gated=True, config=config, launch=launch)


def quantize_act_triton(
    x: Tensor, mode: str, scale: Tensor | None = None, config: dict | None = None,
    launch: Launch = DEFAULT_LAUNCH,
) -> tuple[Tensor, Tensor | None]:
    """The same kernel without the activation; same contract as ``reference.quantize_act_reference``."""
    return _launch(x, mode, scale, gated=False, config=config, launch=launch)
