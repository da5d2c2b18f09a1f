"""Prometheus metrics of the engine model, through the Python backend's ``pb_utils.MetricFamily``.

Triton 2.51's Python backend offers COUNTER, GAUGE and HISTOGRAM families; they appear on the
server's metrics port next to Triton's own per-model metrics. Families must outlive their metrics,
so this object keeps both.
"""

from __future__ import annotations

from ocria.runtime import GenerationStats
from ocria.serving.engine_loop import LoopObserver

LATENCY_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]
ACCEPTANCE_BUCKETS = [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0]
BATCH_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
FINISH_REASONS = ("stop", "length", "cancelled", "error")
ENGINE_STAGES = ("prefill", "decode")  # Scheduler.stage_seconds


class ServingMetrics(LoopObserver):
    """The engine model's metrics, one series per engine instance (labels ``model``, ``instance``, ``device``), so
    that a server with an instance per GPU shows each GPU's share of the work."""

    def __init__(self, pb_utils, model: str, instance: str, device: str):
        mf = pb_utils.MetricFamily
        labels = {"model": model, "instance": instance, "device": device}
        self._families = []

        def family(name: str, help_text: str, kind):
            f = mf(name=name, description=help_text, kind=kind)
            self._families.append(f)
            return f

        self.in_flight = family("ocria_requests_in_flight", "Requests admitted and not yet finished",
                                mf.GAUGE).Metric(labels=labels)
        finished = family("ocria_requests_finished_total", "Finished requests by finish reason", mf.COUNTER)
        self.finished_by = {r: finished.Metric(labels={**labels, "reason": r}) for r in FINISH_REASONS}
        self.generated = family("ocria_generated_tokens_total", "Generated (committed) tokens",
                                mf.COUNTER).Metric(labels=labels)
        self.drafted = family("ocria_draft_tokens_proposed_total", "Draft tokens sent for verification",
                              mf.COUNTER).Metric(labels=labels)
        self.accepted = family("ocria_draft_tokens_accepted_total", "Draft tokens the target accepted",
                               mf.COUNTER).Metric(labels=labels)
        self.acceptance = family("ocria_acceptance_length", "Tokens committed per decode step, per request",
                                 mf.HISTOGRAM).Metric(labels=labels, buckets=ACCEPTANCE_BUCKETS)
        self.ttft = family("ocria_time_to_first_token_seconds", "Submission to first generated token",
                           mf.HISTOGRAM).Metric(labels=labels, buckets=LATENCY_BUCKETS)
        self.itl = family("ocria_inter_token_latency_seconds", "Time between generated tokens",
                          mf.HISTOGRAM).Metric(labels=labels, buckets=LATENCY_BUCKETS)
        self.batch = family("ocria_batch_size", "Requests in each scheduler step",
                            mf.HISTOGRAM).Metric(labels=labels, buckets=BATCH_BUCKETS)
        busy = family("ocria_engine_busy_seconds_total", "Engine loop wall time by stage (prefill: admitting "
                      "requests up to their first token; decode: decode steps)", mf.COUNTER)
        self.busy_by = {stage: busy.Metric(labels={**labels, "stage": stage}) for stage in ENGINE_STAGES}

    def submitted(self) -> None:
        self.in_flight.increment(1)

    def step(self, batch_size: int) -> None:
        self.batch.observe(float(batch_size))

    def first_token(self, ttft_s: float) -> None:
        self.ttft.observe(ttft_s)

    def tokens(self, n: int, inter_token_s: float | None) -> None:
        self.generated.increment(n)
        if inter_token_s is not None:
            self.itl.observe(inter_token_s)

    def finished(self, stats: GenerationStats | None, reason: str | None = None) -> None:
        self.in_flight.increment(-1)
        self.finished_by[reason if reason in self.finished_by else "error"].increment(1)
        if stats is not None:
            self.drafted.increment(stats.num_draft_tokens)
            self.accepted.increment(stats.num_accepted_draft_tokens)
            if stats.num_steps:
                self.acceptance.observe(stats.acceptance_length)

    def busy(self, stage: str, seconds: float) -> None:
        self.busy_by[stage].increment(seconds)
