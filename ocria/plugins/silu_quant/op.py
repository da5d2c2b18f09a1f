"""``torch.library`` operators ``ocria::silu_mul_quant`` and ``ocria::quantize_act`` (the Triton
kernel) and the functions callers use; the execution policy picks the kernel or the PyTorch reference
(``policy.uses``).
Fake implementations give shapes and dtypes so CUDA graphs and ``torch.compile`` accept the ops.
The ops' second output is an empty tensor for modes without scales (``bf16``, ``fp8_static``).
"""

import torch
from torch import Tensor

from ocria.plugins.numerics import NVFP4_BLOCK
from ocria.plugins.policy import AUTO, ExecutionPolicy, Launch
from ocria.plugins.silu_quant.kernel import quantize_act_triton, silu_mul_quant_triton
from ocria.plugins.silu_quant.reference import quantize_act_reference, silu_mul_quant_reference


def _pack(result: tuple[Tensor, Tensor | None], like: Tensor) -> tuple[Tensor, Tensor]:
    out, scales = result
    if scales is None:
        scales = torch.empty(0, dtype=torch.float32, device=like.device)
    return out, scales


@torch.library.custom_op("ocria::silu_mul_quant", mutates_args=())
def _silu_mul_quant_op(gate_up: Tensor, mode: str, scale: Tensor | None, launch: int) -> tuple[Tensor, Tensor]:
    return _pack(silu_mul_quant_triton(gate_up, mode, scale, launch=Launch(launch)), gate_up)


@torch.library.custom_op("ocria::quantize_act", mutates_args=())
def _quantize_act_op(x: Tensor, mode: str, scale: Tensor | None, launch: int) -> tuple[Tensor, Tensor]:
    if mode == "bf16":
        raise ValueError("quantize_act needs a quantized mode")
    return _pack(quantize_act_triton(x, mode, scale, launch=Launch(launch)), x)


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
def _(gate_up: Tensor, mode: str, scale: Tensor | None, launch: int) -> tuple[Tensor, Tensor]:
    return _fake(gate_up, gate_up.shape[-1] // 2, mode)


@_quantize_act_op.register_fake
def _(x: Tensor, mode: str, scale: Tensor | None, launch: int) -> tuple[Tensor, Tensor]:
    return _fake(x, x.shape[-1], mode)


def _scales_of(mode: str, scales: Tensor | None) -> Tensor | None:
    return scales if mode in ("fp8_dynamic", "nvfp4") else None


def silu_mul_quant(
    gate_up: Tensor, mode: str = "bf16", scale: Tensor | None = None, policy: ExecutionPolicy = AUTO
) -> tuple[Tensor, Tensor | None]:
    """Fused ``silu(gate) * up`` -> quantized ``down_proj`` input; see ``reference`` for the contract.

    Args:
        gate_up: [..., 2N], gate then up.
        mode: ``bf16``, ``fp8_static``, ``fp8_dynamic`` or ``nvfp4``.
        scale: the calibrated fp32 scale (``fp8_static``: per tensor; ``nvfp4``: the global scale).
        policy: which implementation runs (``policy.uses``) and how its kernel launches.

    Returns:
        ``(out, scales)``: out [..., N] in gate_up's dtype (``bf16``), float8_e4m3fn [..., N] (FP8 modes) or uint8
        [..., N/2] (``nvfp4``: two E2M1 codes per byte); ``scales`` is None for ``bf16`` / ``fp8_static``, fp32
        [..., 1] for ``fp8_dynamic``, float8_e4m3fn [..., N/16] for ``nvfp4``.
    """
    if not policy.uses("silu_quant", gate_up.device):
        return silu_mul_quant_reference(gate_up, mode, scale)
    out, scales = torch.ops.ocria.silu_mul_quant(gate_up, mode, scale, int(policy.launch))
    return out, _scales_of(mode, scales)


def quantize_act(
    x: Tensor, mode: str, scale: Tensor | None = None, policy: ExecutionPolicy = AUTO
) -> tuple[Tensor, Tensor | None]:
    """Quantize a linear layer's input; see ``reference.quantize_act_reference``.

    Args:
        x: [..., N].
        mode: ``fp8_static``, ``fp8_dynamic`` or ``nvfp4``.
        scale: the calibrated fp32 scale (``fp8_static``: per tensor; ``nvfp4``: the global scale).
        policy: which implementation runs (``policy.uses``) and how its kernel launches.

    Returns:
        ``(out, scales)`` as in ``silu_mul_quant``, with N the width of x.
    """
    if not policy.uses("silu_quant", x.device):
        return quantize_act_reference(x, mode, scale)
    out, scales = torch.ops.ocria.quantize_act(x, mode, scale, int(policy.launch))
    return out, _scales_of(mode, scales)
