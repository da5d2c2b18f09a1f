"""PyTorch reference: the gated attention's output gate, ``o * sigmoid(gate)`` (a copy of the strided gate,
a sigmoid and a multiply: three kernels on the GPU)."""

import torch
from torch import Tensor


def sigmoid_gate_reference(o: Tensor, gate: Tensor) -> Tensor:
    """o, gate [..., H, D] (gate may be a strided view) -> ``o * sigmoid(gate)`` [..., H * D] in o's dtype."""
    return (o * torch.sigmoid(gate)).flatten(-2)
