"""Rounding helpers shared by the Triton kernels of the plugins."""

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
def bf16_bits(x):
    """fp32 -> the int16 bits of its round-to-nearest-even bf16 (NaN stays NaN)."""
    b = x.to(tl.int32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return tl.where(x != x, 0x7FC0, r).to(tl.int16)
