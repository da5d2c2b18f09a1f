"""Batch invariance of a kernel variant: inside ``switches.invariant_rows()`` each batch row's outputs are bit for bit
the same computed alone, in the first half of the batch and in the whole batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bench.ops.registry import Inputs, OpBench, clone_inputs
from bench.ops.switches import invariant_rows


@dataclass(frozen=True)
class InvarianceResult:
    """Whether every compared part equals the whole batch's rows, and which parts differed."""

    op: str
    shape: str
    variant: str
    ok: bool
    differing: tuple[str, ...]


def row_parts(batch: int) -> list[slice]:
    """The sub-batches compared: the first and the last row alone, and the first half."""
    parts = [slice(0, 1), slice(batch - 1, batch), slice(0, max(1, batch // 2))]
    return list({(p.start, p.stop): p for p in parts}.values())


def check_rows(op: OpBench, shape_name: str, variant: str, inputs: Inputs) -> InvarianceResult:
    """``variant`` of ``op`` on the whole batch of ``inputs`` against each of ``row_parts`` alone (the op's outputs,
    not the buffers a mutating op writes: those are per slot, not per row)."""
    call = op.variants[variant].call
    fresh = (lambda i: clone_inputs(i)) if op.mutates else (lambda i: i)
    keep = 1 if op.mutates else None
    with invariant_rows():
        whole = call(fresh(inputs))[:keep]
        batch = whole[0].shape[0]
        differing = []
        for part in row_parts(batch):
            alone = call(fresh(op.rows(inputs, part)))[:keep]
            if not all(torch.equal(a, w[part]) for a, w in zip(alone, whole, strict=True)):
                differing.append(f"rows {part.start}:{part.stop}")
    return InvarianceResult(op.name, shape_name, variant, not differing, tuple(differing))
