"""The server's side: scraping its Prometheus metrics, and what they say happened between two scrapes."""

from __future__ import annotations

import re
import urllib.request
from dataclasses import dataclass

from ocria.bench.serve.backends import one_line
from ocria.errors import OcriaError


@dataclass(frozen=True)
class Scrape:
    """One scrape of a metrics endpoint: each metric name's series as (labels, value)."""

    series: dict[str, list[tuple[dict[str, str], float]]]

    def total(self, name: str, **labels: str) -> float | None:
        """The sum of ``name``'s series whose labels include ``labels``; None when the server has no ``name``.

        Args:
            name: the metric (e.g. ``ocria_batch_size_sum``).
            labels: label values a series must have to be counted.
        Returns:
            The sum, or None.
        """
        if name not in self.series:
            return None
        return sum(v for lab, v in self.series[name] if all(lab.get(k) == want for k, want in labels.items()))


_SAMPLE_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> Scrape:
    """Parse Prometheus' text exposition format (``name{label="v",...} value [timestamp]`` lines; comments and
    lines that do not parse are skipped).

    Args:
        text: the body of a ``/metrics`` response.
    Returns:
        Its samples.
    """
    series: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_LINE.match(line)
        if m is None:
            continue
        name, label_text, value = m.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        labels = {k: _unescape(v) for k, v in _LABEL.findall(label_text or "")}
        series.setdefault(name, []).append((labels, number))
    return Scrape(series)


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def scrape(url: str, timeout_s: float = 10.0) -> Scrape:
    """GET ``url`` and parse it; OcriaError (one line) when it cannot be fetched.

    Args:
        url: the metrics endpoint, e.g. http://127.0.0.1:8002/metrics.
        timeout_s: seconds to wait.
    Returns:
        The scrape.
    """
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return parse_prometheus(r.read().decode("utf-8", "replace"))
    except (OSError, ValueError) as e:  # URLError / HTTPError / timeouts are OSErrors; a bad URL is a ValueError
        raise OcriaError(f"cannot read server metrics at {url} ({one_line(e)})") from None


def counter_delta(before: Scrape, after: Scrape, name: str, **labels: str) -> float | None:
    """How much counter ``name`` grew between two scrapes; None if either lacks it or it went back (a restart).

    Args:
        before: the earlier scrape.
        after: the later scrape.
        name: the metric.
        labels: label values a series must have to be counted.
    Returns:
        The growth, or None.
    """
    a, b = after.total(name, **labels), before.total(name, **labels)
    if a is None or b is None or a < b:
        return None
    return a - b


def histogram_mean(before: Scrape, after: Scrape, name: str) -> float | None:
    """The mean of the observations histogram ``name`` received between two scrapes (``_sum`` / ``_count``
    growth); None if it lacks them or received none.

    Args:
        before: the earlier scrape.
        after: the later scrape.
        name: the histogram family (without ``_sum`` / ``_count``).
    Returns:
        The mean, or None.
    """
    total = counter_delta(before, after, f"{name}_sum")
    count = counter_delta(before, after, f"{name}_count")
    if total is None or not count:
        return None
    return total / count


@dataclass(frozen=True)
class ServerStats:
    """What the server's metrics say happened between two scrapes (None: the server exports no such metric)."""

    generated_tokens: int | None
    mean_batch_size: float | None
    mean_ttft_s: float | None
    mean_inter_token_s: float | None
    mean_acceptance_length: float | None
    draft_tokens_proposed: int | None
    draft_tokens_accepted: int | None
    finished: dict[str, int] | None
    engine_busy: dict[str, float] | None = None  # share of the window's wall time the engine loop spent per stage
    preprocess_ms: float | None = None  # Triton's compute time per request of the preprocessing model
    preprocess_queue_ms: float | None = None  # and its queue time per request
    finished_by_instance: dict[str, int] | None = None  # finished requests per engine instance ("device instance")


def _per_request_ms(before: Scrape, after: Scrape, name: str, model: str) -> float | None:
    """Triton's microsecond counter ``name`` of ``model`` per successful request of it, in milliseconds."""
    us = counter_delta(before, after, name, model=model)
    n = counter_delta(before, after, "nv_inference_request_success", model=model)
    return None if us is None or not n else us / n / 1e3


def server_stats(before: Scrape, after: Scrape, wall_s: float | None = None) -> ServerStats:
    """The ``ocria_*`` metrics' growth between two scrapes, and Triton's own for the preprocessing model.

    Args:
        before: the scrape at the start of the counted window.
        after: the scrape at its end.
        wall_s: seconds between the scrapes (engine_busy is None without it).
    Returns:
        The stats.
    """
    def count(name: str, **labels: str) -> int | None:
        d = counter_delta(before, after, name, **labels)
        return None if d is None else round(d)

    finished = None
    if after.total("ocria_requests_finished_total") is not None:
        reasons = sorted({lab.get("reason", "") for lab, _ in after.series["ocria_requests_finished_total"]})
        finished = {r: count("ocria_requests_finished_total", reason=r) for r in reasons}
    by_instance = None
    if after.total("ocria_requests_finished_total") is not None:
        instances = sorted({(lab.get("device", ""), lab.get("instance", ""))
                            for lab, _ in after.series["ocria_requests_finished_total"] if "instance" in lab})
        by_instance = {f"{dev} {inst}".strip(): count("ocria_requests_finished_total", device=dev, instance=inst)
                       for dev, inst in instances} or None
    busy = None
    if wall_s and after.total("ocria_engine_busy_seconds_total") is not None:
        stages = sorted({lab.get("stage", "") for lab, _ in after.series["ocria_engine_busy_seconds_total"]})
        seconds = {st: counter_delta(before, after, "ocria_engine_busy_seconds_total", stage=st) for st in stages}
        busy = {st: v / wall_s for st, v in seconds.items() if v is not None} or None
    return ServerStats(
        generated_tokens=count("ocria_generated_tokens_total"),
        mean_batch_size=histogram_mean(before, after, "ocria_batch_size"),
        mean_ttft_s=histogram_mean(before, after, "ocria_time_to_first_token_seconds"),
        mean_inter_token_s=histogram_mean(before, after, "ocria_inter_token_latency_seconds"),
        mean_acceptance_length=histogram_mean(before, after, "ocria_acceptance_length"),
        draft_tokens_proposed=count("ocria_draft_tokens_proposed_total"),
        draft_tokens_accepted=count("ocria_draft_tokens_accepted_total"),
        finished=finished, engine_busy=busy,
        preprocess_ms=_per_request_ms(before, after, "nv_inference_compute_infer_duration_us", "preprocessing"),
        preprocess_queue_ms=_per_request_ms(before, after, "nv_inference_queue_duration_us", "preprocessing"),
        finished_by_instance=by_instance)

