"""``torch.library`` operators ``ocria::silu_mul_quant`` and ``ocria::quantize_act``.

The Triton kernel runs on CUDA tensors, and on CPU tensors when ``TRITON_INTERPRET=1`` (the test
suite); otherwise CPU tensors take the PyTorch reference. Fake implementations give shapes and
dtypes so CUDA graphs and ``torch.compile`` accept the ops. The second output is an empty tensor
for modes that produce no scales (``bf16``, ``fp8_static``).
"""

import os

import torch
from torch import Tensor

from ocria.plugins.numerics import NVFP4_BLOCK
from ocria.plugins.silu_quant.kernel import quantize_act_triton, silu_mul_quant_triton
from ocria.plugins.silu_quant.reference import quantize_act_reference, silu_mul_quant_reference


def _use_triton(x: Tensor) -> bool:
    return x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def _pack(result: tuple[Tensor, Tensor | None], like: Tensor) -> tuple[Tensor, Tensor]:
    out, scales = result
    if scales is None:
        scales = torch.empty(0, dtype=torch.float32, device=like.device)
    return out, scales


@torch.library.custom_op("ocria::silu_mul_quant", mutates_args=())
def _silu_mul_quant_op(gate_up: Tensor, mode: str, scale: Tensor | None = None) -> tuple[Tensor, Tensor]:
    fn = silu_mul_quant_triton if _use_triton(gate_up) else silu_mul_quant_reference
    return _pack(fn(gate_up, mode, scale), gate_up)


@torch.library.custom_op("ocria::quantize_act", mutates_args=())
def _quantize_act_op(x: Tensor, mode: str, scale: Tensor | None = None) -> tuple[Tensor, Tensor]:
    if mode == "bf16":
        raise ValueError("quantize_act needs a quantized mode")
    fn = quantize_act_triton if _use_triton(x) else quantize_act_reference
    return _pack(fn(x, mode, scale), x)


def _fake(x: Tensor, n: int, mode: str) -> tuple[Tensor, Tensor]:
    lead = x.shape[:-1]
    if mode == "bf16":
        return x.new_empty(*lead, n), x.new_empty(0, dtype=torch.float32)
    if mode == "fp8_static":
        return x.new_empty(*lead, n, dtype=torch.float8_e4m3fn), x.new_empty(0, dtype=torch.float32)
    if mode == "fp8_dynamic":
        return (x.new_empty(*lead, n, dtype=torch.float8_e4m3fn),
                x.new_empty(*lead, 1, dtype=torch.float32))
    return (x.new_empty(*lead, n // 2, dtype=torch.uint8),
            x.new_empty(*lead, n // NVFP4_BLOCK, dtype=torch.float8_e4m3fn))


@_silu_mul_quant_op.register_fake
def _(gate_up: Tensor, mode: str, scale: Tensor | None = None) -> tuple[Tensor, Tensor]:
    return _fake(gate_up, gate_up.shape[-1] // 2, mode)


@_quantize_act_op.register_fake
def _(x: Tensor, mode: str, scale: Tensor | None = None) -> tuple[Tensor, Tensor]:
    return _fake(x, x.shape[-1], mode)


def silu_mul_quant(gate_up: Tensor, mode: str = "bf16", scale: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """Fused ``silu(gate) * up`` -> quantized ``down_proj`` input; see ``reference`` for the contract.

    Returns ``(out, scales)``: ``scales`` is None for ``bf16`` / ``fp8_static``, fp32 [..., 1] for
    ``fp8_dynamic``, float8_e4m3fn [..., N/16] for ``nvfp4``.
    """
    out, scales = torch.ops.ocria.silu_mul_quant(gate_up, mode, scale)
    return out, (scales if mode in ("fp8_dynamic", "nvfp4") else None)


def quantize_act(x: Tensor, mode: str, scale: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """Quantize a linear layer's input (modes ``fp8_static``, ``fp8_dynamic``, ``nvfp4``)."""
    out, scales = torch.ops.ocria.quantize_act(x, mode, scale)
    return out, (scales if mode in ("fp8_dynamic", "nvfp4") else None)
