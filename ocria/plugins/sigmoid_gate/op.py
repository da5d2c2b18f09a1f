"""``torch.library`` operator ``ocria::sigmoid_gate`` and the function the attention layers call, with the
plugins' switch (None: the Triton kernel on CUDA, the reference elsewhere)."""

import torch
from torch import Tensor

from ocria.plugins.sigmoid_gate.kernel import sigmoid_gate_triton, supports
from ocria.plugins.sigmoid_gate.reference import sigmoid_gate_reference
from ocria.plugins.switch import kernel_enabled


@torch.library.custom_op("ocria::sigmoid_gate", mutates_args=())
def _sigmoid_gate_op(o: Tensor, gate: Tensor) -> Tensor:
    return sigmoid_gate_triton(o, gate)


@_sigmoid_gate_op.register_fake
def _(o: Tensor, gate: Tensor) -> Tensor:
    return o.new_empty(*o.shape[:-2], o.shape[-2] * o.shape[-1])


def sigmoid_gate(o: Tensor, gate: Tensor, use_kernel: bool | None = None) -> Tensor:
    """``o * sigmoid(gate)`` flattened over heads; see ``reference.sigmoid_gate_reference``.

    Args:
        o: [..., H, D].
        gate: [..., H, D] (may be a strided view).
        use_kernel: None picks by ``kernel_enabled`` (the kernel on CUDA unless switched off); True / False force
            the kernel / the reference.

    Returns:
        [..., H * D] in o's dtype.
    """
    if kernel_enabled(o.device, use_kernel, "sigmoid_gate") and supports(o, gate):
        return torch.ops.ocria.sigmoid_gate(o, gate)
    return sigmoid_gate_reference(o, gate)
