"""The sweep's output: the printed lines and table, the result file's content, and the plot."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict

from ocria.bench.results import result_header
from ocria.bench.serve.config import BenchConfig, Load
from ocria.bench.serve.metrics import ServerStats
from ocria.bench.serve.summary import PointResult, Summary, format_shares, shares


def _fmt(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def _pair(summary: Summary | None, scale: float, digits: int) -> str:
    if summary is None:
        return "-"
    return f"{_fmt(summary.p50, scale, digits)}/{_fmt(summary.p99, scale, digits)}"


TABLE_COLUMNS = (("load", 12), ("done", 6), ("err", 5), ("req/s", 8), ("out tok/s", 10), ("TTFT p50/p99 ms", 16),
                 ("E2E p50/p99 s", 14), ("ITL p50 ms", 11), ("tok/req", 8), ("batch", 6), ("accept", 7),
                 ("srv TTFT ms", 12), ("prefill/decode busy", 20), ("pre ms", 7), ("per instance", 14))


def table_row(p: PointResult) -> list[str]:
    """One point as the table's cells (``-``: not measured).

    Args:
        p: the point.
    Returns:
        The cells, in TABLE_COLUMNS' order.
    """
    load = Load(p.concurrency, p.request_rate).label
    s = p.server
    return [load, str(p.completed), str(p.errors), _fmt(p.requests_per_s, digits=2),
            _fmt(p.output_tokens_per_s), _pair(p.ttft_s, 1e3, 1), _pair(p.latency_s, 1.0, 2),
            _fmt(p.itl_s.p50 if p.itl_s else None, 1e3, 2), _fmt(p.mean_tokens_per_request),
            _fmt(s.mean_batch_size if s else None, digits=2), _fmt(s.mean_acceptance_length if s else None, digits=2),
            _fmt(s.mean_ttft_s if s else None, 1e3, 1), _busy(s), _fmt(s.preprocess_ms if s else None, digits=2),
            format_shares(shares(p.served_by or (s.finished_by_instance if s else None)))]


def _busy(s: ServerStats | None) -> str:
    if s is None or not s.engine_busy:
        return "-"
    return "/".join(f"{s.engine_busy.get(stage, 0.0):.0%}" for stage in ("prefill", "decode"))


def format_table(points: Sequence[PointResult]) -> str:
    """The sweep as a fixed-width table, one row per point.

    Args:
        points: the results.
    Returns:
        The table's lines joined.
    """
    widths = [w for _, w in TABLE_COLUMNS]
    lines = ["".join(f"{name:>{w}}" for name, w in TABLE_COLUMNS)]
    lines += ["".join(f"{cell:>{w}}" for cell, w in zip(table_row(p), widths)) for p in points]
    return "\n".join(lines)


def result_dict(config: BenchConfig, backend: str, points: Sequence[PointResult]) -> dict:
    """The result file's content: header, arguments, one summary per point (no per-request samples).

    Args:
        config: the sweep.
        backend: the backend's name.
        points: the results.
    Returns:
        A JSON-ready dict.
    """
    args = asdict(config)
    args["images"] = str(config.images)
    args["out"] = str(config.out)
    args["loads"] = [asdict(load) for load in config.loads]
    return {**result_header("serve"), "backend": backend, "sweep": config.sweep, "args": args,
            "points": [asdict(p) for p in points]}


def plot(result: dict, fig) -> None:
    """Requests/s, output tokens/s and TTFT p50/p99 against the sweep's concurrency or request rate.

    Args:
        result: what ``result_dict`` returned.
        fig: an empty matplotlib figure.
    """
    points = result["points"]
    sweep = result["sweep"]
    xs = [p[sweep] for p in points]
    xlabel = "concurrent streams" if sweep == "concurrency" else "request rate (requests/s)"
    requests, tokens, ttft = fig.subplots(1, 3)
    requests.plot(xs, [p["requests_per_s"] for p in points], "o-", label="completed")
    if sweep == "request_rate":
        requests.plot(xs, xs, ":", color="gray", label="offered")
        requests.legend()
    requests.set_title("requests/s")
    values = [p["output_tokens_per_s"] for p in points]
    if any(v is not None for v in values):
        tokens.plot(xs, [math.nan if v is None else v for v in values], "o-", color="tab:green")
    else:
        tokens.text(0.5, 0.5, "n/a: the server sent no token ids", transform=tokens.transAxes, ha="center",
                    color="gray")
        tokens.set_yticks([])
    tokens.set_title("output tokens/s")
    for pct, style in (("p50", "o-"), ("p99", "s--")):
        ttft.plot(xs, [math.nan if p["ttft_s"] is None else p["ttft_s"][pct] * 1e3 for p in points], style,
                  label=pct)
    ttft.set_title("time to first token (ms)")
    ttft.legend()
    for ax in (requests, tokens, ttft):
        _sweep_axis(ax, xs, xlabel)
    args = result["args"]
    mode = "streaming" if args["params"]["stream"] else "not streaming"
    fig.suptitle(f"ocria bench serve  {args['url']}  ({mode}, max_tokens {args['params']['max_tokens'] or 'default'})")


def _sweep_axis(ax, xs: Sequence[float], label: str) -> None:
    if len(xs) > 1 and min(xs) > 0 and max(xs) / min(xs) >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{x:g}" for x in xs])
    ax.set_xlabel(label)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)


def describe(config: BenchConfig, load: Load, i: int) -> str:
    """The line announcing point ``i``: its load, warmup and measuring limit."""
    limit = " and ".join(x for x in (f"{config.duration_s:g}s" if config.duration_s is not None else "",
                                     f"{config.requests} requests" if config.requests is not None else "") if x)
    what = (f"{load.concurrency} concurrent stream{'s' * (load.concurrency != 1)}" if load.concurrency is not None
            else f"{load.request_rate:g} requests/s (Poisson, at most {config.max_concurrency} in flight)")
    return f"[{i + 1}/{len(config.loads)}] {what}: warmup {config.warmup_s:g}s, measuring up to {limit}"


def point_line(p: PointResult) -> str:
    """The line ending a point: completed and failed requests, rates, TTFT p50, the first errors."""
    tokens = "" if p.output_tokens_per_s is None else f", {p.output_tokens_per_s:.1f} out tok/s"
    ttft = "" if p.ttft_s is None else f", TTFT p50 {p.ttft_s.p50 * 1e3:.1f} ms"
    errors = f"; errors: {' | '.join(p.error_messages)}" if p.errors else ""
    return (f"  {p.completed} done, {p.errors} failed in {p.wall_s:.1f}s: {p.requests_per_s:.2f} req/s"
            f"{tokens}{ttft}{errors}")

