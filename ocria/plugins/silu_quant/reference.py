"""Plain PyTorch reference for the fused SiLU(gate) x up -> quantized down_proj input.

Layout: ``gate_up`` [..., 2N] is the output of a fused gate/up projection whose weight is
``cat([gate_proj.weight, up_proj.weight], dim=0)``: gate in the first half of the last dim, up in
the second (the vLLM/TensorRT-LLM ``SiluAndMul`` convention).

The activation is the model's unfused chain in the input dtype, ``F.silu(gate) * up``: silu is
computed in fp32 as ``g / (1 + exp(-g))`` and rounded to the input dtype, the product is computed
in fp32 and rounded again. The quantizers then see exactly the tensor ModelOpt's ``down_proj``
input quantizer sees during calibration.
"""

import torch
from torch import Tensor

from ocria.plugins import numerics as nx

MODES = ("bf16", "fp8_static", "fp8_dynamic", "nvfp4")


def silu_mul(gate_up: Tensor) -> Tensor:
    """``silu(gate) * up`` with the input dtype's two roundings; [..., 2N] -> [..., N]."""
    gate, up = gate_up.chunk(2, dim=-1)
    g = gate.float()
    s = (g / (1 + torch.exp(-g))).to(gate_up.dtype)
    return (s.float() * up.float()).to(gate_up.dtype)


def quantize_act_reference(h: Tensor, mode: str, scale: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """Quantize an activation for a linear layer's input.

    - ``bf16``: (h, None) unchanged;
    - ``fp8_static``: (float8_e4m3fn like h, None) with the calibrated per-tensor ``scale``;
    - ``fp8_dynamic``: (float8_e4m3fn like h, fp32 per-token scales [..., 1]);
    - ``nvfp4``: (uint8 [..., N/2] two E2M1 per byte, float8_e4m3fn block scales [..., N/16]) with
      the calibrated fp32 global ``scale`` (ModelOpt's ``input_scale``).
    """
    if mode == "bf16":
        return h, None
    if mode == "fp8_static":
        return nx.quantize_fp8(h, scale), None
    if mode == "fp8_dynamic":
        return nx.quantize_fp8_per_token(h)
    if mode == "nvfp4":
        return nx.quantize_nvfp4(h, scale)
    raise ValueError(f"unknown activation quantization mode {mode!r}; expected one of {MODES}")


def silu_mul_quant_reference(
    gate_up: Tensor, mode: str, scale: Tensor | None = None
) -> tuple[Tensor, Tensor | None]:
    """Unfused chain: ``quantize_act_reference(silu_mul(gate_up), mode, scale)``."""
    return quantize_act_reference(silu_mul(gate_up), mode, scale)
