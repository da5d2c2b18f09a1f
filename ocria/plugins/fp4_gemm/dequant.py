"""NVFP4 dequantization shared by the tensor-core GEMM and the CUDA-core GEMV: the PTX that turns packed codes into
bf16 products, and the integer-unpacking pieces of the path without it (CPU interpreter, GPUs before sm_89)."""

import triton
import triton.language as tl

from ocria.plugins.rounding import widen_e4m3

# 2^100: times an E4M3 block scale a normal number, exact in fp32 and bf16, whatever the scale (subnormal ones too)
SCALE_BIAS: tl.constexpr = tl.constexpr(1.2676506002282294e30)


@triton.jit
def e2m1_f32(codes):
    """4-bit E2M1 codes (int32, sign in bit 3) -> ``e2m1 * 2^-126`` in fp32: the magnitude bits at the bottom of the
    exponent field (codes 0 and 0.5 land on subnormals with the right value), the sign at bit 31."""
    return (((codes & 7) << 22) | ((codes & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def block_scale_f32(scale_bytes):
    """E4M3 block-scale bytes (any integer type) -> ``scale * 2^100`` in fp32, by bits (integer-unpacking path)."""
    return widen_e4m3(scale_bytes) * SCALE_BIAS


@triton.jit
def block_scale_bf16(scale):
    """float8 E4M3 block scales -> ``scale * 2^100`` in bf16 (exact), the PTX path's ``$5`` operand."""
    return (scale.to(tl.float32) * SCALE_BIAS).to(tl.bfloat16)


@triton.jit
def repeat_cols(x, R: tl.constexpr):
    """[rows, cols] -> [rows, cols * R], each column repeated R times (a block scale per word or per weight)."""
    return tl.reshape(tl.broadcast_to(x[:, :, None], [x.shape[0], x.shape[1], R]), [x.shape[0], x.shape[1] * R])


# $4 holds two int16 words of packed weights, codes c0..c3 (low half) and c4..c7 (high half), 4 bits
# each with the sign in bit 3; $5 the bf16 scale of each word. Output $j is the bf16x2 pair
# (c_j, c_j+4) times the scales: the three magnitude bits of a code go to bf16 bits 8..6 (exponent
# bits 1..0 and the top mantissa bit: e2m1 * 2^-126), its sign to bit 15. Per output one lop3
# (LUT 0xE4: mask ? a : b) takes the sign bits from a shifted copy of the masked signs and the
# magnitude bits from a shifted copy of the masked magnitudes; each mask selects a only where b can
# be nonzero outside its target bits and a cannot. 14 integer ops and 4 multiplies (ptxas: HMUL2)
# per 8 weights. Pairing c_j with c_j+4 keeps both codes at the same place in their half; the
# tensor-core kernel orders K to match (see _nvfp4_gemm_kernel); the GEMV meets code j of word i with x[4i + j].
_BODY = """\
.reg .b32 sg, ma, mb, a, b, v, z;
mov.b32 z, 0x80008000;
and.b32 sg, $4, 0x88888888;
and.b32 ma, $4, 0x07070707;
and.b32 mb, $4, 0x70707070;
shl.b32 a, sg, 12;
shl.b32 b, ma, 6;
lop3.b32 v, a, b, 0xC001C000, 0xE4;
fma.rn.bf16x2 {0}, v, $5, z;
shl.b32 a, sg, 8;
shl.b32 b, mb, 2;
lop3.b32 v, a, b, 0xC001C000, 0xE4;
fma.rn.bf16x2 {1}, v, $5, z;
shl.b32 a, sg, 4;
shr.b32 b, ma, 2;
lop3.b32 v, a, b, 0x8001C001, 0xE4;
fma.rn.bf16x2 {2}, v, $5, z;
shr.b32 b, mb, 6;
lop3.b32 v, sg, b, 0x8001C001, 0xE4;
fma.rn.bf16x2 {3}, v, $5, z;
"""
DEQUANT_ASM: tl.constexpr = tl.constexpr("{\n" + _BODY.format(*(f"${j}" for j in range(4))) + "}")

# The same with fp32 outputs (the GEMV's FMA operands): output j element h is code j of word h (operand $2j+h), the
# bf16 product widened in the register (low half: shift; high half: mask), 2 integer ops per 2 weights where a
# bf16 -> fp32 convert of each half costs 3.
DEQUANT_F32_ASM: tl.constexpr = tl.constexpr(
    "{\n.reg .b32 p0, p1, p2, p3;\n" + _BODY.replace("$4", "$8").replace("$5", "$9").format("p0", "p1", "p2", "p3")
    + "".join(f"shl.b32 ${2 * j}, p{j}, 16;\nand.b32 ${2 * j + 1}, p{j}, 0xFFFF0000;\n" for j in range(4)) + "}")
