"""GPU time of one variant: rotating copies of the inputs (enough that what the bytes floor counts crosses HBM,
not L2), round-robin in a CUDA graph (``ocria.bench.timing.time_calls``), median µs per call."""

from __future__ import annotations

import torch

from bench.ops.registry import Inputs, OpBench, OpCall, Shape, clone_inputs
from ocria.bench.timing import median_us, rotating_calls, time_calls

ROTATE_BYTES = 256 << 20  # past the H100's and H200's 50 MB L2 several times
MAX_COPIES = 64


def input_copies(op: OpBench, shape: Shape, inputs: Inputs) -> list[Inputs]:
    """``inputs`` and copies of it, together at least ``ROTATE_BYTES`` of the shape's floor (at most MAX_COPIES)."""
    copies = max(1, min(MAX_COPIES, -(-ROTATE_BYTES // max(1, op.floor(shape).bytes))))
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
