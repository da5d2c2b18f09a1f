"""Reference FP8 (E4M3) and NVFP4 (E2M1 + E4M3 block scales) quantizers in the ModelOpt unified layout.

Every rounding step is written out explicitly (integer/bit arithmetic on fp32, no reliance on a
cast's rounding) so the Triton kernels can mirror it operation by operation and the tests can
prove both against ModelOpt 0.47's own quantizers and exporters.

Rounding rules (all round-to-nearest, ties to even):

- E4M3 (``float8_e4m3fn``): ``t = float32(x) / scale`` (one IEEE division), ``|t|`` saturates at
  448 (so ``±inf`` and anything above 448 become ``±448``), then rounds to 3 mantissa bits with
  subnormals below 2^-6 (step 2^-9). NaN stays NaN; the sign of zero is kept.
- E2M1 (NVFP4 element): grid {0, 0.5, 1, 1.5, 2, 3, 4, 6}; ties go to the even code
  (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4); above 6 saturates at
  6; NaN and ±inf map to ±6 (code 7, the sign of NaN is dropped), as ModelOpt's ``_cast_fp4``.
- NVFP4 block scale (one per 16 consecutive inputs): ``amax(|block|) / (6 * global_scale)``,
  a zero result becomes 1.0, clamped to [2^-9, 448] and rounded to E4M3; a NaN anywhere in the
  block makes the block scale NaN and every element of the block code 7.
  Elements are then ``x / (float32(block_scale) * global_scale)``, rounded to E2M1 and packed two
  per byte along the last dim, even index in the low nibble.
- Dynamic per-token FP8 scale: ``amax(|row|) / 448`` with ModelOpt's guard: an amax of at most
  2^-24 uses 1.0 instead (an all-zero row quantizes to zeros with scale 1/448).
"""

import torch
from torch import Tensor

E4M3_MAX = 448.0
E2M1_MAX = 6.0
NVFP4_BLOCK = 16
FP8_AMAX_EPS = 2.0**-24
E4M3_MIN_SCALE = 2.0**-9
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _f32_exponent(a: Tensor) -> Tensor:
    """Unbiased binary exponent of non-negative fp32 values (fp32 subnormals give -127)."""
    return ((a.view(torch.int32) >> 23) & 0xFF) - 127


def _exact_divisor(value: float, like: Tensor) -> Tensor:
    """A divisor as a tensor on ``like``'s device: PyTorch's CUDA division by a Python number
    multiplies by its rounded reciprocal instead of dividing, which changes the last bit. Filled on the
    device, not copied from the host: a copy cannot be captured in a CUDA graph."""
    return torch.full((), value, dtype=torch.float32, device=like.device)


def _rint(y: Tensor) -> Tensor:
    """Round-half-even to an integer for 0 <= y < 2^22 using fp32 addition of 2^23 (exact ulp 1)."""
    big = torch.tensor(8388608.0, dtype=torch.float32)
    return (y + big) - big


def e4m3_encode(t: Tensor) -> Tensor:
    """fp32 values -> float8_e4m3fn bit patterns (uint8), with saturation at 448 and RNE."""
    t = t.float()
    a = t.abs().clamp(max=E4M3_MAX)
    e = _f32_exponent(a).clamp(min=-6)
    # a * 2^(3 - e) is exact (a power-of-two rescale) and lies in [0, 16].
    y = a * torch.ldexp(torch.ones_like(a), (3 - e).float())
    mag = (e + 6) * 8 + _rint(y).to(torch.int32)
    mag = torch.where(t.isnan(), torch.full_like(mag, 0x7F), mag)
    sign = (t.view(torch.int32) >> 31) & 1
    return (mag | (sign << 7)).to(torch.uint8)


def e2m1_encode(t: Tensor) -> Tensor:
    """fp32 values (already divided by their scale) -> 4-bit E2M1 codes in uint8 (sign bit 3)."""
    t = t.float()
    a = t.abs()
    low = _rint(a * 2.0).to(torch.int32)  # codes 0..4 for a <= 2 (step 0.5)
    mid = _rint(a).to(torch.int32) + 2  # codes 4..6 for 2 < a <= 4 (step 1)
    high = torch.where(a > 5.0, 7, 6)  # step 2 above 4: tie at 5 goes to 4 (even)
    code = torch.where(a <= 2.0, low, torch.where(a <= 4.0, mid, high))
    code = torch.where(a.isnan(), torch.full_like(code, 7), code)
    sign = (t < 0).to(torch.int32)  # -0.0 and NaN get a positive sign, as in ModelOpt
    return (code | (sign << 3)).to(torch.uint8)


def e4m3_decode(bits: Tensor) -> Tensor:
    """float8_e4m3fn bit patterns (uint8) or float8 tensors -> fp32."""
    if bits.dtype == torch.uint8:
        bits = bits.view(torch.float8_e4m3fn)
    return bits.float()


def e2m1_decode(codes: Tensor) -> Tensor:
    """4-bit E2M1 codes -> fp32 values."""
    table = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32)
    return table.to(codes.device)[codes.long()]


def pack_e2m1(codes: Tensor) -> Tensor:
    """[..., K] codes -> [..., K/2] uint8, element 2i in the low nibble, 2i+1 in the high nibble."""
    codes = codes.to(torch.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_e2m1(packed: Tensor) -> Tensor:
    """[..., K/2] uint8 -> [..., K] codes (inverse of ``pack_e2m1``)."""
    lo, hi = packed & 0x0F, packed >> 4
    return torch.stack((lo, hi), dim=-1).flatten(-2)


def quantize_fp8(x: Tensor, scale: Tensor | float) -> Tensor:
    """Static per-tensor FP8: ``e4m3(float32(x) / scale)`` -> float8_e4m3fn, shape of ``x``."""
    scale = torch.as_tensor(scale, dtype=torch.float32, device=x.device).reshape(())
    return e4m3_encode(x.float() / scale).view(torch.float8_e4m3fn)


def fp8_per_token_scales(x: Tensor) -> Tensor:
    """Dynamic per-token scales [..., 1] fp32: ``amax(|row|) / 448`` (amax <= 2^-24 -> 1.0)."""
    amax = x.float().abs().amax(dim=-1, keepdim=True)
    amax = torch.where(amax <= FP8_AMAX_EPS, torch.ones_like(amax), amax)
    return amax / _exact_divisor(E4M3_MAX, amax)


def quantize_fp8_per_token(x: Tensor) -> tuple[Tensor, Tensor]:
    """Dynamic per-token FP8: returns (float8_e4m3fn like ``x``, fp32 scales [..., 1])."""
    scales = fp8_per_token_scales(x)
    return e4m3_encode(x.float() / scales).view(torch.float8_e4m3fn), scales


def dequantize_fp8(q: Tensor, scale: Tensor | float, dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """``float32(q) * scale`` cast to ``dtype`` (one rounding; ModelOpt's ``FP8QTensor.dequantize``
    multiplies in ``dtype`` instead); ``scale`` is a scalar or broadcasts (per token)."""
    scale = torch.as_tensor(scale, dtype=torch.float32, device=q.device)
    return (e4m3_decode(q) * scale).to(dtype)


def nvfp4_global_scale(amax: Tensor | float) -> Tensor:
    """fp32 ``weight_scale_2`` / ``input_scale`` of NVFP4: ``amax / (6 * 448)``."""
    amax = torch.as_tensor(amax, dtype=torch.float32)
    return amax / _exact_divisor(E2M1_MAX * E4M3_MAX, amax)


def nvfp4_block_scales(x: Tensor, global_scale: Tensor | float) -> Tensor:
    """Per-16-block E4M3 scales [..., K/16] (float8_e4m3fn) for ``x`` [..., K]."""
    if x.shape[-1] % NVFP4_BLOCK:
        raise ValueError(f"NVFP4 needs the last dim to be a multiple of 16, got {x.shape[-1]}")
    g = torch.as_tensor(global_scale, dtype=torch.float32, device=x.device).reshape(())
    blocks = x.float().unflatten(-1, (-1, NVFP4_BLOCK))
    amax = blocks.abs().amax(dim=-1)
    s = amax / (E2M1_MAX * g)
    s = torch.where(s == 0, torch.ones_like(s), s).clamp(min=E4M3_MIN_SCALE, max=E4M3_MAX)
    return e4m3_encode(s).view(torch.float8_e4m3fn)


def quantize_nvfp4(
    x: Tensor, global_scale: Tensor | float, block_scales: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """NVFP4: returns (packed uint8 [..., K/2], block scales float8_e4m3fn [..., K/16]).

    ``global_scale`` is the fp32 ``weight_scale_2`` (weights) or ``input_scale`` (activations);
    block scales are computed from ``x`` unless given (ModelOpt's static path).
    """
    g = torch.as_tensor(global_scale, dtype=torch.float32, device=x.device).reshape(())
    if block_scales is None:
        block_scales = nvfp4_block_scales(x, g)
    blocks = x.float().unflatten(-1, (-1, NVFP4_BLOCK))
    t = blocks / (block_scales.float() * g).unsqueeze(-1)
    return pack_e2m1(e2m1_encode(t.flatten(-2))), block_scales


def dequantize_nvfp4(
    packed: Tensor, block_scales: Tensor, global_scale: Tensor | float, dtype: torch.dtype = torch.bfloat16
) -> Tensor:
    """``e2m1 * (float32(block_scale) * global_scale)`` in fp32, cast to ``dtype``; shape [..., K]."""
    g = torch.as_tensor(global_scale, dtype=torch.float32, device=packed.device).reshape(())
    values = e2m1_decode(unpack_e2m1(packed)).unflatten(-1, (-1, NVFP4_BLOCK))
    return (values * (block_scales.float() * g).unsqueeze(-1)).flatten(-2).to(dtype)
