"""Variants chosen by the plugins' switches (``ocria/plugins/switch.py``): a call with kernels set aside through
``OCRIA_DISABLE_KERNELS``, or inside ``batch_invariant_rows()``."""

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from bench.ops.registry import Inputs, OpCall, Outputs
from ocria.plugins.switch import DISABLE_ENV, batch_invariant_rows


@contextmanager
def kernels_disabled(*names: str) -> Iterator[None]:
    """``OCRIA_DISABLE_KERNELS`` holding ``names`` besides what it held, restored after the block."""
    saved = os.environ.get(DISABLE_ENV)
    os.environ[DISABLE_ENV] = ",".join(filter(None, [saved, *names]))
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(DISABLE_ENV, None)
        else:
            os.environ[DISABLE_ENV] = saved


def without(call: OpCall, *names: str) -> OpCall:
    """``call`` run with the kernels or code paths ``names`` disabled (e.g. ``replay_ssm_ws``, ``nvfp4_gemv``)."""
    def run(inputs: Inputs) -> Outputs:
        with kernels_disabled(*names):
            return call(inputs)
    return run


def invariant(call: Callable[[Inputs], Outputs]) -> OpCall:
    """``call`` inside ``batch_invariant_rows()`` (the code a batch-invariant decode step runs)."""
    def run(inputs: Inputs) -> Outputs:
        with batch_invariant_rows():
            return call(inputs)
    return run
