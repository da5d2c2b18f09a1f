"""The gated attention's output gate ``o * sigmoid(gate)`` in one launch."""

from ocria.plugins.sigmoid_gate.op import sigmoid_gate
from ocria.plugins.sigmoid_gate.reference import sigmoid_gate_reference

__all__ = ["sigmoid_gate", "sigmoid_gate_reference"]
