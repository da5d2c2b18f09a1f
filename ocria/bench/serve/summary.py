"""A sweep point's numbers from its counted requests: percentiles, rates, tokens, finish reasons, errors."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ocria.bench.serve.config import Load
from ocria.bench.serve.load import RequestSample
from ocria.bench.serve.metrics import ServerStats

MAX_ERROR_MESSAGES = 5

@dataclass(frozen=True)
class Summary:
    """Percentiles (linear interpolation, as numpy's default) and mean of some samples."""

    p50: float
    p90: float
    p99: float
    mean: float


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of sorted values, interpolating linearly between the two nearest ranks.

    Args:
        ordered: sorted values, at least one.
        q: the percentile, 0 to 100.
    Returns:
        The percentile.
    """
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(values: Sequence[float]) -> Summary | None:
    """p50/p90/p99/mean of ``values``; None when there are none.

    Args:
        values: the samples, in any order.
    Returns:
        Their summary, or None.
    """
    if not values:
        return None
    ordered = sorted(values)
    return Summary(percentile(ordered, 50), percentile(ordered, 90), percentile(ordered, 99),
                   sum(ordered) / len(ordered))


@dataclass(frozen=True)
class PointResult:
    """One sweep point's numbers (seconds; None where not measurable, e.g. tokens without token ids)."""

    concurrency: int | None
    request_rate: float | None
    max_concurrency: int | None
    wall_s: float
    completed: int
    errors: int
    error_messages: list[str]
    requests_per_s: float
    output_tokens: int | None
    output_tokens_per_s: float | None
    mean_tokens_per_request: float | None
    ttft_s: Summary | None
    latency_s: Summary | None
    itl_s: Summary | None
    finish_reasons: dict[str, int]
    server: ServerStats | None
    served_by: dict[str, int] | None = None  # completed requests per engine instance, as the replies name it


def point_result(load: Load, max_concurrency: int | None, samples: Sequence[RequestSample], measure_start: float,
                 now: float, server: ServerStats | None) -> PointResult:
    """Summarize one point's counted samples.

    Args:
        load: the point.
        max_concurrency: the open loop's cap (None for a closed loop).
        samples: the counted requests, failed ones included.
        measure_start: when counting began.
        now: when the point ended (used as its end if no request ended).
        server: the server's side of the window, if scraped.
    Returns:
        The point's result.
    """
    ok = [s for s in samples if s.error is None]
    failed = [s for s in samples if s.error is not None]
    end = max((s.end for s in samples), default=now)
    wall = max(end - measure_start, 1e-9)
    with_ids = [s for s in ok if s.tokens is not None]
    tokens = sum(s.tokens for s in with_ids) if with_ids else None
    reasons: dict[str, int] = {}
    for s in ok:
        reasons[s.finish_reason or "none"] = reasons.get(s.finish_reason or "none", 0) + 1
    served: dict[str, int] = {}
    for s in ok:
        if s.served_by is not None:
            served[s.served_by] = served.get(s.served_by, 0) + 1
    return PointResult(
        concurrency=load.concurrency, request_rate=load.request_rate, max_concurrency=max_concurrency,
        wall_s=wall, completed=len(ok), errors=len(failed), error_messages=first_distinct(s.error for s in failed),
        requests_per_s=len(ok) / wall,
        output_tokens=tokens,
        output_tokens_per_s=None if tokens is None else tokens / wall,
        mean_tokens_per_request=None if tokens is None else tokens / len(ok),
        ttft_s=summarize([s.ttft_s for s in ok if s.ttft_s is not None]),
        latency_s=summarize([s.latency_s for s in ok]),
        itl_s=summarize([x for s in ok for x in s.itl_s]),
        finish_reasons=reasons, server=server, served_by=served or None)


def shares(counts: dict[str, int] | None) -> dict[str, float] | None:
    """Each engine instance's share of the requests, in instance order; None when nothing was counted.

    Args:
        counts: requests per instance (``served_by``, or the server's ``finished_by_instance``), or None.
    Returns:
        The fractions, summing to 1, or None.
    """
    total = sum(counts.values()) if counts else 0
    return {k: v / total for k, v in sorted(counts.items())} if total else None


def format_shares(fractions: dict[str, float] | None) -> str:
    """``shares``' fractions as ``51%/49%`` (``-``: unknown)."""
    return "/".join(f"{v:.0%}" for v in fractions.values()) if fractions else "-"


def first_distinct(messages, limit: int = MAX_ERROR_MESSAGES) -> list[str]:
    """The first ``limit`` distinct messages, in order.

    Args:
        messages: any iterable of strings.
        limit: how many to keep.
    Returns:
        The messages.
    """
    out: list[str] = []
    for m in messages:
        if m not in out:
            out.append(m)
            if len(out) == limit:
                break
    return out

