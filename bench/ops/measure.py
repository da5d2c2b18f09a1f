"""GPU time of one variant: rotating copies of the inputs (enough that what the bytes floor counts crosses HBM,
not L2), round-robin in a CUDA graph (``ocria.bench.timing.time_calls``), median µs per call."""

from __future__ import annotations

import torch

from bench.ops.registry import Inputs, OpBench, OpCall, Shape, clone_inputs
from ocria.bench.timing import median_us, rotating_calls, rotation_copies, time_calls


def input_copies(op: OpBench, shape: Shape, inputs: Inputs) -> list[Inputs]:
    """``inputs`` and copies of it, together past L2 by the shape's floor (``rotation_copies``)."""
    copies = rotation_copies(op.floor(shape).bytes)
    return [inputs, *(clone_inputs(inputs) for _ in range(copies - 1))]


def time_variant(call: OpCall, copies: list[Inputs]) -> float:
    """Median µs per call of ``call`` over the rotating ``copies``: a CUDA graph, or eager calls where a library
    call cannot be captured."""
    fns = rotating_calls(call, copies)
    try:
        return time_calls(fns, min_calls=max(20, len(fns)))
    except RuntimeError:  # not capturable: eager rounds of the same calls
        torch.cuda.synchronize()

        def rounds() -> None:
            for _ in range(10):
                for f in fns:
                    f()

        rounds()
        return median_us(rounds, 10 * len(fns), 15)
