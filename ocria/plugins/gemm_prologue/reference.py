"""PyTorch references of the prologue GEMM: the elementwise op before a decoder layer's output GEMM, and the GEMM.

The ops (``Prologue``), each on two inputs a, b [B, T, H, D] (views allowed) flattened to the GEMM's input
[B, T, H * D], rounded where the models round them:

- ``SILU_MUL``: the MLP's ``silu(gate) * up`` (a = gate, b = up; H = 1), ``silu_quant.reference.silu_mul``'s chain;
- ``SIGMOID_GATE``: the gated attention's ``o * sigmoid(gate)``, ``sigmoid_gate_reference``;
- ``GATED_NORM``: the GDN output norm ``w * norm(o) * silu(z)`` per head of D (a = o, b = z),
  ``gated_rms_norm_reference``.

The GEMM then reads that input in bf16 (a bf16 weight) or quantized to FP8 (an FP8 weight: per tensor with the
layer's static scale, or per token), as ``quantize_act_reference`` quantizes it.
"""

from enum import IntEnum

import torch
from torch import Tensor

from ocria.plugins.decode_gemm.reference import decode_gemm_fp8_fp32, decode_gemm_fp32
from ocria.plugins.rms_norm.reference import gated_rms_norm_reference
from ocria.plugins.sigmoid_gate.reference import sigmoid_gate_reference
from ocria.plugins.silu_quant.reference import quantize_act_reference, silu_mul


class Prologue(IntEnum):
    SILU_MUL = 1
    SIGMOID_GATE = 2
    GATED_NORM = 3


def prologue_reference(kind: Prologue, a: Tensor, b: Tensor, norm_weight: Tensor | None = None,
                       eps: float = 0.0) -> Tensor:
    """The op's output, the GEMM's input.

    Args:
        kind: which op.
        a, b: [B, T, H, D] inputs of one dtype.
        norm_weight: [D] (``GATED_NORM`` only).
        eps: the norm's epsilon (``GATED_NORM`` only).
    Returns:
        [B, T, H * D] in a's dtype.
    """
    if kind == Prologue.SILU_MUL:
        return silu_mul(torch.cat((a, b), dim=-1)).flatten(-2)
    if kind == Prologue.SIGMOID_GATE:
        return sigmoid_gate_reference(a, b)
    return gated_rms_norm_reference(a, b, norm_weight, eps).flatten(-2)


def prologue_gemm_reference(kind: Prologue, a: Tensor, b: Tensor, weight: Tensor, norm_weight: Tensor | None = None,
                            eps: float = 0.0, x_mode: str = "bf16", x_scale: Tensor | None = None,
                            w_scale: Tensor | None = None) -> Tensor:
    """The kernel's math: ``prologue_reference``, quantized by ``x_mode`` (``bf16``, ``fp8_static`` with
    ``x_scale``, ``fp8_dynamic``), times the weight [N, K] (bf16, or E4M3 with ``w_scale``: one per tensor or per
    row) as exact fp32 products and sums, rounded once to bf16.

    Returns:
        [B, T, N] bf16.
    """
    h = prologue_reference(kind, a, b, norm_weight, eps)
    if x_mode == "bf16":
        return decode_gemm_fp32(h, weight)
    q, token_scales = quantize_act_reference(h, x_mode, x_scale)
    return decode_gemm_fp8_fp32(q, weight, token_scales if token_scales is not None else x_scale, w_scale)
