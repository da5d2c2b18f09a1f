"""Fused SiLU(gate) x up -> BF16 / FP8 (static or per-token) / NVFP4 activation for ``down_proj``."""

from ocria.plugins.silu_quant.op import quantize_act, silu_mul_quant
from ocria.plugins.silu_quant.reference import MODES, quantize_act_reference, silu_mul, silu_mul_quant_reference

__all__ = ["MODES", "quantize_act", "quantize_act_reference", "silu_mul", "silu_mul_quant",
           "silu_mul_quant_reference"]
