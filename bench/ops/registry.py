"""The kernel-benchmark registry: what each plugin op is benchmarked on (``Shape``), what it must move at least
(``Floor``), what it must equal (``reference`` under a ``Tolerance``) and which implementations are timed
(``Variant``). The runner (``bench.ops.run``) reads nothing else.

Every variant and the reference take the dict of tensors ``OpBench.inputs`` makes and return a tuple of tensors: the
op's outputs, then any buffer it writes in place (an op that mutates its inputs sets ``mutates``: each call then gets
its own copies)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

Inputs = dict[str, Tensor]
Outputs = tuple[Tensor, ...]
OpCall = Callable[[Inputs], Outputs]

# One module per plugin under bench/ops/kernels/, in the order the runner lists them.
KERNEL_MODULES = ("replay_ssm", "silu_quant", "decode_gemm", "fp4_gemm", "decode_attention", "rms_norm", "kv_write",
                  "sigmoid_gate", "gemm_prologue")


@dataclass(frozen=True)
class Shape:
    """One benchmarked size of an op.

    Args:
        name: unique within the op, e.g. ``sim_mlp_down_m1`` (preset, layer, rows).
        sizes: the op's dimensions by name (e.g. ``M``, ``N``, ``K``).
        cpu: a tiny shape the Triton interpreter checks in seconds (what ``--device cpu`` runs).
    """

    name: str
    sizes: tuple[tuple[str, int], ...]
    cpu: bool = False

    def __getitem__(self, key: str) -> int:
        return dict(self.sizes)[key]

    def as_dict(self) -> dict[str, int]:
        return dict(self.sizes)


def shape(name: str, cpu: bool = False, **sizes: int) -> Shape:
    """``Shape(name, sizes)`` from keyword sizes, in the order given."""
    return Shape(name, tuple(sizes.items()), cpu)


@dataclass(frozen=True)
class Floor:
    """What one call must move and compute at least: ``bytes`` read + written once (weights, inputs, outputs,
    state), ``flops`` of the math (multiply-add = 2)."""

    bytes: int
    flops: int


@dataclass(frozen=True)
class Tolerance:
    """How a variant's outputs must match the reference's, tensor by tensor (NaN where the reference has NaN).

    Args:
        kind: ``bits`` (equal bytes), ``ulps`` (at most ``limit`` units in the last place of the dtype) or ``rel``
            (max |got - want| over max |want| at most ``limit``).
        limit: the bound for ``ulps`` and ``rel`` (0 for ``bits``).
        why: where the bound comes from (the plugin's tests).
    """

    kind: Literal["bits", "ulps", "rel"]
    limit: float = 0.0
    why: str = ""


BITS = Tolerance("bits", 0, "the kernel rounds where the reference rounds")


@dataclass(frozen=True)
class Variant:
    """One implementation of an op.

    Args:
        call: inputs -> outputs, like the reference.
        cuda_only: a library call or code path with no CPU form (``torch._scaled_mm``, PTX dequantization).
        kernel: a Triton kernel of the plugin (checked on CPU in the interpreter); False: a library baseline.
    """

    call: OpCall
    cuda_only: bool = False
    kernel: bool = True


@dataclass(frozen=True)
class OpBench:
    """One plugin op in the registry.

    Args:
        name: what ``--op`` selects.
        shapes: preset shapes (ocria-mini, ocria-1-sim) and at least one ``cpu`` shape.
        inputs: (shape, device, generator) -> the tensors every variant takes.
        floor: shape -> the bytes and flops one call needs at least.
        reference: the plugin's plain-PyTorch reference (``ocria/plugins/<op>/reference.py``).
        variants: name -> implementation; ``kernel`` is the plugin's entry point with the kernel forced on.
        check: how each variant must match the reference.
        baseline: the variant (or ``reference``) every row's time is compared with.
        mutates: variants write into their inputs (each call gets copies).
        rows: (inputs, rows) -> the inputs of those batch rows alone, for ``--invariance`` (None: not row-wise).
        ptxas: variant name -> shape -> ``bench.ops.ptxas.Sm90Build`` of its main kernel (``--ptxas``).
    """

    name: str
    shapes: tuple[Shape, ...]
    inputs: Callable[[Shape, torch.device, torch.Generator], Inputs]
    floor: Callable[[Shape], Floor]
    reference: OpCall
    variants: Mapping[str, Variant]
    check: Tolerance
    baseline: str = "reference"
    mutates: bool = False
    rows: Callable[[Inputs, slice], Inputs] | None = None
    ptxas: Mapping[str, Callable[[Shape], object]] = field(default_factory=dict)

    def shape(self, name: str) -> Shape:
        for s in self.shapes:
            if s.name == name:
                return s
        raise KeyError(name)


def all_ops() -> dict[str, OpBench]:
    """Every registered op by name (the plugin modules are imported here, not at import of this module)."""
    ops: dict[str, OpBench] = {}
    for module in KERNEL_MODULES:
        for op in importlib.import_module(f"bench.ops.kernels.{module}").BENCHES:
            if op.name in ops:
                raise ValueError(f"op {op.name!r} registered twice")
            ops[op.name] = op
    return ops


def leading_rows(inputs: Inputs, rows: slice, names: tuple[str, ...]) -> Inputs:
    """``inputs`` with the tensors named in ``names`` cut to ``rows`` of their first dimension (the batch)."""
    return {k: (v[rows] if k in names else v) for k, v in inputs.items()}


def clone_inputs(inputs: Inputs) -> Inputs:
    """Copies of the tensors (views stay views of a copied base, strides kept: the kernels see the same layout)."""
    bases: dict[int, Tensor] = {}
    out = {}
    for k, v in inputs.items():
        base = v._base if v._base is not None else v
        copy = bases.setdefault(id(base), base.clone())
        out[k] = copy.as_strided(v.shape, v.stride(), v.storage_offset() - base.storage_offset()) \
            if v._base is not None else copy
    return out
