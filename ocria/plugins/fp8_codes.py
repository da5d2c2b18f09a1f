"""FP8 E4M3 codes in Triton, shared by the kernels that quantize activations (SiLU-quant, the norms' FP8 outputs):
bytes identical to ModelOpt's quantizer (``ocria.plugins.numerics``) on the GPU and in the CPU interpreter.
On the GPU, where every scale of the tile is in range, the quotient by the scale is a multiply by the correctly
rounded reciprocal plus one FMA correction, taken on |h|, and PTX's single-rounding ``cvt.rn.satfinite.e4m3x2.f32``
makes the byte, h's sign put back from its bits (``e4m3_cvt``). Elsewhere (other scales, the interpreter) an IEEE
division and a code built by hand (``e4m3_code``). Not ``tl.float8e4nv``: it converts through fp16 and rounds
midpoints down (measured byte for byte against the reference on the H200)."""

import triton
import triton.language as tl


@triton.jit
def quotient(a, s, r, lim, ON_GPU: tl.constexpr, NEG_S: tl.constexpr = False):
    """RN(min(a, lim) / s) for a >= 0 or NaN (kept). The interpreter divides (IEEE); the GPU multiplies by
    r = RN(1/s) and corrects once with an FMA, which is correctly rounded by Markstein's theorem
    (lim keeps the quotient <= 512, far from overflow; underflowing quotients round to 0 anyway).
    The correction needs -t or -s, and Triton negates by subtracting: NEG_S negates s before it is broadcast,
    one instruction less per element than -t; the per-token FP8 row kernel keeps -t (NEG_S cost it spills)."""
    a = tl.minimum(a, lim, propagate_nan=tl.PropagateNan.ALL)
    if ON_GPU:
        r = tl.zeros_like(a) + r
        t = a * r
        if NEG_S:
            return tl.fma(tl.fma(t, tl.zeros_like(a) + (0.0 - s), a), r, t)
        return tl.fma(tl.fma(-t, tl.zeros_like(a) + s, a), r, t)
    else:
        return tl.math.div_rn(a, tl.zeros_like(a) + s)


@triton.jit
def e4m3_magnitude(a):
    """(E4M3 code as int32, its exact value as fp32) of a in [0, 464) (finite): RNE, so a rounding to 448 or above
    gives 448 (0x7E). The code counts eighths of the binade, (exponent + 6) * 8 + RN(a * 2^(3 - exponent)), a carry
    into the next binade included; the rounded integer is read from the low mantissa bits of that product plus
    2^23 (ulp 1), not converted: float -> int converts issue on the GPU's quarter-rate unit, which the silu's exp,
    reciprocal and bf16 roundings already keep busy."""
    ex = tl.maximum((a.to(tl.int32, bitcast=True) >> 23) - 127, -6)
    y = a * ((130 - ex) << 23).to(tl.float32, bitcast=True) + 8388608.0  # a * 2^(3 - ex) is exact; one rounding
    code = (ex + 6) * 8 + (y.to(tl.int32, bitcast=True) - 0x4B000000)
    value = (y - 8388608.0) * ((124 + ex) << 23).to(tl.float32, bitcast=True)  # RN(a * 2^(3 - ex)) * 2^(ex - 3)
    return code, value


@triton.jit
def e4m3_code(t):
    """fp32 -> (E4M3 byte as int32, exact E4M3 value of |t| as fp32): RNE, saturation at 448, NaN 0x7F."""
    code, value = e4m3_magnitude(tl.minimum(tl.abs(t), 448.0))
    return with_sign(tl.where(t != t, 0x7F, code), t), value


@triton.jit
def with_sign(code, x):
    """An E4M3 magnitude code with x's sign bit as bit 7."""
    return code | ((x.to(tl.int32, bitcast=True) >> 24) & 0x80)


@triton.jit
def e4m3_bytes(h, row_scale, ON_GPU: tl.constexpr):
    """E4M3 bytes of RN(h / row_scale) (h [BLOCK_M, BLOCK_N], row_scale [BLOCK_M]). On the GPU, when every row's
    scale lies in [2^-64, 2^119], the quotient is the reciprocal + FMA correction of ``quotient`` on |h| clamped at
    448 x scale (NaN kept; a quotient that large saturates anyway, and the clamped one rounds to 448 within an ulp),
    and ``e4m3_cvt`` rounds it and puts h's sign back; other scales (0, inf, NaN, extremes) divide and build the code
    by hand."""
    s = row_scale[:, None]
    ok = 0  # the interpreter always divides
    if ON_GPU:
        ok = tl.min(((row_scale >= 5.421010862427522e-20) & (row_scale <= 6.646139978924579e35)).to(tl.int32), 0)
    if ok == 1:
        r = tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s)
        code = e4m3_cvt(quotient(tl.abs(h), s, r, s * 448.0, ON_GPU), h)
    else:
        code = e4m3_code(tl.math.div_rn(h, tl.zeros_like(h) + s))[0].to(tl.uint8)
    return code


@triton.jit
def e4m3_cvt(q, x):
    """E4M3 bytes of q >= 0 (or NaN) by the GPU's single-rounding convert (sm_89+), two values per instruction: RNE,
    finite values past 448 saturate to 448, NaN gives a NaN byte; each byte then takes x's sign bit. The sign is
    set apart from the quotient because Triton negates by subtracting from +0, which loses the sign of -0."""
    return tl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; .reg .b32 c, s01, s23, s;"
        " cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3; mov.b32 c, {lo, hi};"
        " prmt.b32 s01, $5, $6, 0x0073; prmt.b32 s23, $7, $8, 0x0073; prmt.b32 s, s01, s23, 0x5410;"
        " and.b32 s, s, 0x80808080; or.b32 $0, c, s; }",
        "=r,f,f,f,f,r,r,r,r", [q, x.to(tl.int32, bitcast=True)], dtype=tl.uint8, is_pure=True, pack=4)


@triton.jit
def max_nan(a, b):
    """max that keeps NaN (a reduction's combine: a NaN anywhere makes the result NaN)."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def abs_max(h, axis: tl.constexpr):
    """max |h| along ``axis``, NaN where h has a NaN."""
    return tl.reduce(tl.abs(h), axis, max_nan)


@triton.jit
def token_scale(h, mask):
    """Per-token FP8 scale of rows h (where ``mask``): ``scale_of`` their amax."""
    return scale_of(abs_max(tl.where(mask, h, 0.0), 1))


@triton.jit
def scale_of(amax):
    """amax / 448 (ModelOpt's guard: amax <= 2^-24 -> 1); a NaN amax (a row with a NaN) gives a NaN scale."""
    amax = tl.where(amax <= 5.9604644775390625e-08, 1.0, amax)
    return tl.math.div_rn(amax, tl.zeros_like(amax) + 448.0)
