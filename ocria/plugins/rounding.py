"""Rounding and bit-level conversion helpers shared by the Triton kernels of the plugins."""

import torch
import triton
import triton.language as tl
from torch import Tensor


def bf16_as_int16(t: Tensor) -> Tensor:
    """bf16 tensors as their int16 bits (what ``widen`` reads and ``bf16_bits`` writes); others as they are."""
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


@triton.jit
def round_to_dtype(x, IS_BF16: tl.constexpr, ON_GPU: tl.constexpr, dtype: tl.constexpr):
    """fp32 -> nearest value of ``dtype`` (kept in fp32): the GPU's RNE convert; in the interpreter,
    whose fp32 -> bf16 cast truncates, bf16 rounding is done on the bits."""
    if IS_BF16:
        if ON_GPU:
            return x.to(tl.bfloat16).to(tl.float32)
        else:
            b = x.to(tl.int32, bitcast=True)
            r = ((b + 0x7FFF + ((b >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
            return tl.where(x != x, x, r)
    else:
        return x.to(dtype).to(tl.float32)


@triton.jit
def widen(x, IS_BF16: tl.constexpr):
    """Loaded values -> fp32; bf16 comes as int16 bits and becomes the top half of an fp32."""
    if IS_BF16:
        return (x.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


@triton.jit
def widen_e4m3(b):
    """float8 E4M3 bytes (any integer type) -> their exact fp32 values, by bits: the integer unpacking paths
    and the interpreter, which has no float8 arithmetic."""
    b = b.to(tl.int32)
    e = (b >> 3) & 0xF
    m = b & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)  # (1 + m/8) * 2^(e-7)
    mag = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)  # subnormals: m * 2^-9
    mag = tl.where((e == 15) & (m == 7), float("nan"), mag)
    return tl.where((b & 0x80) != 0, -mag, mag)


@triton.jit
def bf16_bits(x):
    """fp32 -> the int16 bits of its round-to-nearest-even bf16 (NaN stays NaN)."""
    b = x.to(tl.int32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return tl.where(x != x, 0x7FC0, r).to(tl.int16)
