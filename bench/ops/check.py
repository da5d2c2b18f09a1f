"""A variant's outputs against the reference's under the op's ``Tolerance``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from bench.ops.registry import Outputs, Tolerance

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True)
class CheckResult:
    """ok, the worst measure over the outputs (mismatching elements, ulps or relative error) and a one-line reason
    when not ok."""

    ok: bool
    worst: float
    reason: str = ""


def _bits(t: Tensor) -> Tensor:
    """The tensor's elements as integers, every NaN as one value (E4M3 NaN 0x7F / 0xFF alike)."""
    t = t.contiguous()
    if t.dtype == torch.float8_e4m3fn:
        u = t.view(torch.uint8).to(torch.int32)
        return torch.where((u & 0x7F) == 0x7F, torch.full_like(u, 0x7F), u)
    if t.is_floating_point():
        nan = t.isnan()
        t = torch.where(nan, torch.zeros_like(t), t)
        return t.view(_INT_VIEW[t.element_size()]).long() + nan.long() * (1 << 40)
    return t.long()


def _ulps(a: Tensor, b: Tensor) -> float:
    """Max distance in units in the last place (same-sign ordering of the float bits); NaNs excluded."""
    ok = ~(a.isnan() | b.isnan())
    view = _INT_VIEW[a.element_size()]
    sign = 1 << (8 * a.element_size() - 1)
    ia, ib = (t[ok].contiguous().view(view).long() for t in (a, b))
    ia, ib = (torch.where(t < 0, -(t + sign), t) for t in (ia, ib))
    return float((ia - ib).abs().max()) if ia.numel() else 0.0


def _rel(a: Tensor, b: Tensor) -> float:
    ok = ~b.isnan()
    a, b = a[ok].double(), b[ok].double()
    if not b.numel():
        return 0.0
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def compare(got: Outputs, want: Outputs, tol: Tolerance) -> CheckResult:
    """Each output of ``got`` against the same output of ``want``: same count, shapes and dtypes, NaN where the
    reference has NaN (``rel``, ``ulps``), then the tolerance's measure at most its limit."""
    if len(got) != len(want):
        return CheckResult(False, float("inf"), f"{len(got)} outputs, the reference has {len(want)}")
    worst = 0.0
    for n, (g, w) in enumerate(zip(got, want, strict=True)):
        if g.shape != w.shape or g.dtype != w.dtype:
            return CheckResult(False, float("inf"), f"output {n}: {g.dtype} {tuple(g.shape)}, the reference "
                                                    f"{w.dtype} {tuple(w.shape)}")
        if tol.kind == "bits" or not g.is_floating_point() or g.dtype == torch.float8_e4m3fn:
            measure = float((_bits(g) != _bits(w)).sum())
        else:
            if not torch.equal(g.isnan(), w.isnan()):
                return CheckResult(False, float("inf"), f"output {n}: NaN where the reference has none, or none "
                                                        "where it has")
            measure = _ulps(g, w) if tol.kind == "ulps" else _rel(g, w)
        exact = tol.kind == "bits" or not g.is_floating_point() or g.dtype == torch.float8_e4m3fn
        if measure > (0 if exact else tol.limit):
            what = "elements differ" if exact else tol.kind
            return CheckResult(False, measure, f"output {n}: {measure:g} {what} (limit {0 if exact else tol.limit:g})")
        worst = max(worst, measure)
    return CheckResult(True, worst)
