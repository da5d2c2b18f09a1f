"""One background thread drives one continuous-batching Scheduler for all requests of a server.

Requests arrive from any thread (Triton's execute); the loop admits them, steps the scheduler, and
hands every Event to the request's sink. The scheduler is not thread-safe, so only the loop thread
touches it: submissions and cancellations go through a queue. Sinks run on a second thread, in order:
building and sending responses (IPC under Triton) overlaps the next step's GPU work instead of
delaying it. Each request's ``is_cancelled`` (an IPC call under Triton) is polled every
``cancel_period_s``, or after the step that overran it. If a step raises, the loop dies: every open
request gets a final error and ``on_death`` is called, so a crashed engine turns into errors and an
unready model instead of hung clients.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from ocria.errors import OcriaError
from ocria.runtime import Event, GenerationStats, PreparedPrompt, SamplingParams


class EngineUnavailable(OcriaError):
    """The loop is dead or shutting down: the request was fine, the engine cannot serve it."""


# A sink gets (event, None) or (None, error); an error is the request's final word: a RequestError
# (the request itself is bad) or EngineUnavailable.
Sink = Callable[[Event | None, OcriaError | None], None]


class LoopObserver:
    """Metric hooks; the Triton model implements them with Prometheus metrics. No-ops by default."""

    def submitted(self) -> None: ...

    def step(self, batch_size: int) -> None: ...

    def first_token(self, ttft_s: float) -> None: ...

    def tokens(self, n: int, inter_token_s: float | None) -> None: ...

    def finished(self, stats: GenerationStats | None, reason: str | None) -> None: ...

    def busy(self, stage: str, seconds: float) -> None: ...


@dataclass
class _Open:
    sink: Sink
    is_cancelled: Callable[[], bool]
    submitted: float
    rid: int = -1
    last_token: float | None = None
    cancel_sent: bool = False


@dataclass
class EngineLoop:
    engine: object  # ocria.runtime.Engine
    max_batch_size: int | None = None
    cancel_period_s: float = 0.1
    observer: LoopObserver = field(default_factory=LoopObserver)
    on_death: Callable[[str], None] | None = None

    def __post_init__(self):
        self._inbox: queue.Queue = queue.Queue()
        self._keys = itertools.count(1)
        self._open: dict[int, _Open] = {}  # key -> request (loop thread only)
        self._by_rid: dict[int, int] = {}  # scheduler rid -> key
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._outbox: queue.Queue = queue.Queue()  # (sink, event, error) for the sender thread; None ends it
        self._sender: threading.Thread | None = None
        self.error: str | None = None
        self.max_batch_seen = 0
        self._busy_reported: dict[str, float] = {}  # Scheduler.stage_seconds as last reported to the observer
        self._busy_report_at = 0.0

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    def start(self) -> EngineLoop:
        self.scheduler = self.engine.scheduler(self.max_batch_size)
        self._sender = threading.Thread(target=self._send_loop, name="ocria-engine-sender", daemon=True)
        self._sender.start()
        self._thread = threading.Thread(target=self._run, name="ocria-engine-loop", daemon=True)
        self._thread.start()
        return self

    def new_key(self) -> int:
        """A fresh request key (thread-safe): reserve it before submit when the sink needs to know it."""
        return next(self._keys)

    def submit(self, prompt: PreparedPrompt, params: SamplingParams, sink: Sink,
               is_cancelled: Callable[[], bool] = lambda: False, key: int | None = None) -> int:
        """Queue a request (validate it first with engine.check); returns its key for cancel()."""
        if not self.alive:
            raise OcriaError(f"engine loop is not running: {self.error or 'not started'}")
        key = self.new_key() if key is None else key
        self._inbox.put(("add", key, prompt, params, _Open(sink, is_cancelled, time.perf_counter())))
        return key

    def cancel(self, key: int) -> None:
        self._inbox.put(("cancel", key))

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._inbox.put(("wake",))
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._outbox.put(None)
        if self._sender is not None:
            self._sender.join(timeout_s)

    # -- loop thread --------------------------------------------------------------------------------

    def _run(self) -> None:
        last_poll = 0.0
        try:
            while not self._stop.is_set():
                busy = self.scheduler.has_work()
                self._drain(block=not busy)
                now = time.perf_counter()
                if now - last_poll >= self.cancel_period_s:
                    self._poll_cancelled()
                    last_poll = now
                if self.scheduler.has_work():
                    self._step()
        except Exception as e:  # the loop is dead: fail everything open, never leave a client hanging
            self.error = f"{type(e).__name__}: {e}"
            traceback.print_exc()
            for key in list(self._open):
                self._finish_with_error(key, f"engine loop died: {self.error}")
            while True:
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if item[0] == "add":
                    self._outbox.put((item[4].sink, None, EngineUnavailable(f"engine loop died: {self.error}")))
            self._outbox.join()  # every client has its error before the model goes away
            if self.on_death is not None:
                self.on_death(self.error)
        finally:  # stop(): end what is still open with a final (cancelled) event
            for key in list(self._open):
                self._finish_with_error(key, "server is shutting down")

    def _drain(self, block: bool) -> None:
        timeout = self.cancel_period_s if block else None
        while True:
            try:
                item = self._inbox.get(timeout=timeout) if timeout else self._inbox.get_nowait()
            except queue.Empty:
                return
            timeout = None
            if item[0] == "add":
                _, key, prompt, params, req = item
                try:
                    req.rid = self.scheduler.add(prompt, params)
                except OcriaError as e:
                    self._outbox.put((req.sink, None, e))
                    continue
                self._open[key] = req
                self._by_rid[req.rid] = key
                self.observer.submitted()
            elif item[0] == "cancel":
                self._cancel(item[1])

    def _cancel(self, key: int) -> None:
        req = self._open.get(key)
        if req is not None and not req.cancel_sent:
            req.cancel_sent = True
            self.scheduler.cancel(req.rid)

    def _poll_cancelled(self) -> None:
        for key, req in list(self._open.items()):
            if not req.cancel_sent and req.is_cancelled():
                self._cancel(key)

    def _step(self) -> None:
        events = self.scheduler.step()
        self._report_busy()
        batch = len({ev.request_id for ev in events if ev.finish_reason != "cancelled"})
        if batch:
            self.max_batch_seen = max(self.max_batch_seen, batch)
            self.observer.step(batch)
        now = time.perf_counter()
        for ev in events:
            key = self._by_rid.get(ev.request_id)
            req = self._open.get(key)
            if req is None:
                continue
            if ev.token_ids:
                if req.last_token is None:
                    self.observer.first_token(now - req.submitted)
                    gap = None
                else:
                    gap = (now - req.last_token) / len(ev.token_ids)
                self.observer.tokens(len(ev.token_ids), gap)
                req.last_token = now
            if ev.finished:
                del self._open[key], self._by_rid[ev.request_id]
                self.observer.finished(ev.stats, ev.finish_reason)
            self._outbox.put((req.sink, ev, None))

    def _report_busy(self, every_s: float = 0.5) -> None:
        """The scheduler's time per stage since the last report, at most every ``every_s`` seconds (an observer's
        metric call can be a round trip to the server process: once per step would slow the loop it measures)."""
        now = time.perf_counter()
        if now - self._busy_report_at < every_s:
            return
        self._busy_report_at = now
        for stage, seconds in self.scheduler.stage_seconds.items():
            grown = seconds - self._busy_reported.get(stage, 0.0)
            if grown > 0:
                self.observer.busy(stage, grown)
                self._busy_reported[stage] = seconds

    def _finish_with_error(self, key: int, message: str) -> None:
        req = self._open.pop(key)
        self._by_rid.pop(req.rid, None)
        self.observer.finished(None, "error")
        self._outbox.put((req.sink, None, EngineUnavailable(message)))

    # -- sender thread ------------------------------------------------------------------------------

    def _send_loop(self) -> None:
        """Run sinks in submission order; a failing sink (a client gone away) must not stop the others."""
        while True:
            item = self._outbox.get()
            try:
                if item is None:
                    return
                sink, event, error = item
                try:
                    sink(event, error)
                except Exception:
                    traceback.print_exc()
            finally:
                self._outbox.task_done()
