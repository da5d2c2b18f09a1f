"""``torch.library`` operator ``ocria::sigmoid_gate`` and the function the attention layers call; the execution
policy picks the Triton kernel or the reference (``policy.uses``)."""

import torch
from torch import Tensor

from ocria.plugins.policy import AUTO, ExecutionPolicy, Launch
from ocria.plugins.sigmoid_gate.kernel import sigmoid_gate_triton, supports
from ocria.plugins.sigmoid_gate.reference import sigmoid_gate_reference


@torch.library.custom_op("ocria::sigmoid_gate", mutates_args=())
def _sigmoid_gate_op(o: Tensor, gate: Tensor, launch: int) -> Tensor:
    return sigmoid_gate_triton(o, gate, launch=Launch(launch))


@_sigmoid_gate_op.register_fake
def _(o: Tensor, gate: Tensor, launch: int) -> Tensor:
    return o.new_empty(*o.shape[:-2], o.shape[-2] * o.shape[-1])


def sigmoid_gate(o: Tensor, gate: Tensor, policy: ExecutionPolicy = AUTO) -> Tensor:
    """``o * sigmoid(gate)`` flattened over heads; see ``reference.sigmoid_gate_reference``.

    Args:
        o: [..., H, D].
        gate: [..., H, D] (may be a strided view).
        policy: which implementation runs (``policy.uses``) and how its kernel launches.

    Returns:
        [..., H * D] in o's dtype.
    """
    if policy.uses("sigmoid_gate", o.device) and supports(o, gate):
        return torch.ops.ocria.sigmoid_gate(o, gate, int(policy.launch))
    return sigmoid_gate_reference(o, gate)
