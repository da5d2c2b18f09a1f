"""The execution policy a kernel variant runs under: every kernel (``ocria.plugins.policy.ALL_KERNELS``), less the
code paths a variant disables (``without``), with batch-invariant rows inside ``invariant_rows()`` (what a decode
step runs, and what the invariance check compares). A variant's call passes ``current()`` to the op explicitly."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace

from bench.ops.registry import Inputs, OpCall, Outputs
from ocria.plugins.policy import ALL_KERNELS, ExecutionPolicy

_POLICY: ContextVar[ExecutionPolicy] = ContextVar("bench_ops_policy", default=ALL_KERNELS)


def current() -> ExecutionPolicy:
    """The policy the variant being run passes to its op."""
    return _POLICY.get()


@contextmanager
def running(policy: ExecutionPolicy) -> Iterator[None]:
    """``current()`` is ``policy`` within the block."""
    token = _POLICY.set(policy)
    try:
        yield
    finally:
        _POLICY.reset(token)


def invariant_rows() -> Iterator[None]:
    """Within: ``current()`` with batch-invariant rows (``ExecutionPolicy.for_steps``)."""
    return running(current().for_steps())


def without(call: OpCall, *names: str) -> OpCall:
    """``call`` run with the kernels or code paths ``names`` disabled (e.g. ``replay_ssm_ws``, ``nvfp4_gemv``)."""
    def run(inputs: Inputs) -> Outputs:
        with running(replace(current(), disabled=current().disabled | frozenset(names))):
            return call(inputs)
    return run


def invariant(call: Callable[[Inputs], Outputs]) -> OpCall:
    """``call`` with batch-invariant rows (the code a batch-invariant decode step runs)."""
    def run(inputs: Inputs) -> Outputs:
        with invariant_rows():
            return call(inputs)
    return run
