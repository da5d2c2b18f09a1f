"""The load generator: timing one request, the window of requests a sweep point sends and counts, the Poisson
schedule, and the ``Driver`` that sends them from threads in a closed or an open loop."""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from ocria.bench.serve.backends import Backend, BackendFactory, one_line
from ocria.bench.serve.config import Load, RequestParams
from ocria.errors import OcriaError

PROGRESS_EVERY_S = 5.0

@dataclass
class RequestSample:
    """What the client saw of one request (seconds on ``time.perf_counter``'s clock)."""

    start: float
    end: float
    ttft_s: float | None = None  # send -> first chunk with text or tokens
    tokens: int | None = None  # token ids received; None: the server sent none
    itl_s: list[float] = field(default_factory=list)  # per later chunk: gap to the previous chunk / its tokens
    error: str | None = None
    finish_reason: str | None = None
    served_by: str | None = None  # the engine instance that served it, where the replies say (``Reply``)

    @property
    def latency_s(self) -> float:
        return self.end - self.start


def measure_request(backend: Backend, image: bytes, params: RequestParams, seed: int,
                    clock: Callable[[], float] = time.perf_counter) -> RequestSample:
    """Send one request and time it; a failed request (OcriaError) becomes a sample with ``error`` set.

    Args:
        backend: where to send it.
        image: the document image's bytes.
        params: what the request asks for.
        seed: its sampling seed.
        clock: seconds, monotonic.
    Returns:
        The request's sample.
    """
    start = clock()
    sample = RequestSample(start, start)
    previous = None
    tokens, saw_ids = 0, False
    try:
        for reply in backend.send(image, params, seed):
            now = clock()
            n = len(reply.token_ids)
            tokens += n
            saw_ids = saw_ids or n > 0
            sample.finish_reason = reply.finish_reason or sample.finish_reason
            sample.served_by = getattr(reply, "served_by", None) or sample.served_by
            if not (reply.text or n):
                continue
            if previous is None:
                sample.ttft_s = now - start
            elif n:
                sample.itl_s.append((now - previous) / n)
            previous = now
    except OcriaError as e:
        sample.error = one_line(e) or type(e).__name__
    sample.end = clock()
    sample.tokens = tokens if saw_ids else None
    return sample


@dataclass(frozen=True)
class Ticket:
    """Leave to send one request: its index in the point (image and seed offset) and whether it is counted."""

    index: int
    counted: bool


class Window:
    """Which requests a sweep point sends: uncounted warmup ones until ``measure_start``, then counted ones until
    the deadline or until ``requests`` of them have been sent. Thread-safe."""

    def __init__(self, warmup_s: float, duration_s: float | None, requests: int | None,
                 clock: Callable[[], float] = time.perf_counter):
        """Args:
            warmup_s: seconds of uncounted requests first.
            duration_s: seconds of counted requests (None: until ``requests`` are sent).
            requests: how many counted requests at most (None: until the deadline).
            clock: seconds, monotonic.
        """
        self.clock = clock
        self.t0 = clock()
        self.measure_start = self.t0 + warmup_s
        self.deadline = self.measure_start + (duration_s if duration_s is not None else math.inf)
        self.requests = requests
        self._lock = threading.Lock()
        self._index = 0
        self._counted = 0
        self._stopped = False

    def admit(self, now: float | None = None) -> Ticket | None:
        """A ticket for a request starting at ``now`` (default: the clock), or None: send no more.

        Args:
            now: when the request starts (an open loop passes its scheduled arrival time).
        Returns:
            The ticket, or None once the window is over.
        """
        now = self.clock() if now is None else now
        with self._lock:
            if self._stopped or now >= self.deadline or (self.requests is not None and self._counted >= self.requests):
                return None
            counted = now >= self.measure_start
            self._counted += counted
            self._index += 1
            return Ticket(self._index - 1, counted)

    def stop(self) -> None:
        """Admit nothing more (Ctrl-C)."""
        with self._lock:
            self._stopped = True

    @property
    def sent(self) -> int:
        """Counted requests admitted so far."""
        with self._lock:
            return self._counted


def poisson_arrivals(rate: float, seed: int) -> Iterator[float]:
    """Arrival times (seconds from 0) of a Poisson process: exponential gaps with mean ``1 / rate``, forever.

    Args:
        rate: requests per second, > 0.
        seed: the generator's seed (the same seed, the same schedule).
    Returns:
        An endless iterator of increasing times.
    """
    rng = random.Random(seed)
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        yield t


class Driver:
    """Sends one sweep point's requests from daemon threads and collects the counted samples."""

    def __init__(self, make_backend: BackendFactory, images: Sequence[bytes], params: RequestParams, seed: int,
                 window: Window):
        """Args:
            make_backend: a new Backend for each sending thread.
            images: the documents; requests cycle through them.
            params: what every request asks for.
            seed: request i gets seed + i.
            window: which requests to send and count.
        """
        self.make_backend = make_backend
        self.images = images
        self.params = params
        self.seed = seed
        self.window = window
        self.samples: list[RequestSample] = []
        self.in_flight = 0
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._failure: BaseException | None = None

    def start(self, load: Load, max_concurrency: int) -> None:
        """Start the closed loop's streams, or the open loop's dispatcher."""
        if load.concurrency is not None:
            for _ in range(load.concurrency):
                self._spawn(self._stream)
        else:
            self._spawn(self._dispatch, load.request_rate, max_concurrency)

    def join(self, tick: Callable[[], None] | None = None, tick_every_s: float = PROGRESS_EVERY_S
             ) -> list[RequestSample]:
        """Wait for every request to end, calling ``tick`` every ``tick_every_s``; re-raise a thread's crash.

        Returns:
            The counted samples, in the order they ended.
        """
        next_tick = time.perf_counter() + tick_every_s
        while True:
            with self._lock:
                alive = [t for t in self._threads if t.is_alive()]
            if not alive:
                break
            alive[0].join(timeout=max(0.0, min(0.5, next_tick - time.perf_counter())))
            if tick is not None and time.perf_counter() >= next_tick:
                tick()
                next_tick += tick_every_s
        if self._failure is not None:
            raise self._failure
        return self.samples

    def _spawn(self, target: Callable, *args) -> None:
        def guarded():
            try:
                target(*args)
            except BaseException as e:  # a bug, not a failed request: stop the point, re-raise from join
                self._failure = self._failure or e
                self.window.stop()

        thread = threading.Thread(target=guarded, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _stream(self) -> None:
        """Closed loop: send the next request as soon as the previous one ends."""
        backend = self.make_backend()
        while (ticket := self.window.admit()) is not None:
            self._send(backend, ticket)

    def _dispatch(self, rate: float, max_concurrency: int) -> None:
        """Open loop: one request per scheduled arrival, each in its own thread, at most ``max_concurrency`` at
        once (a late arrival waits for a free slot, then is timed from when it is actually sent)."""
        slots = threading.BoundedSemaphore(max_concurrency)
        for offset in poisson_arrivals(rate, self.seed):
            arrival = self.window.t0 + offset
            if arrival >= self.window.deadline:
                return
            sleep_until(arrival)
            ticket = self.window.admit(arrival)
            if ticket is None:
                return
            slots.acquire()
            self._spawn(self._send_and_release, ticket, slots)

    def _send_and_release(self, ticket: Ticket, slots: threading.BoundedSemaphore) -> None:
        try:
            self._send(self.make_backend(), ticket)
        finally:
            slots.release()

    def _send(self, backend: Backend, ticket: Ticket) -> None:
        with self._lock:
            self.in_flight += 1
        try:
            image = self.images[ticket.index % len(self.images)]
            sample = measure_request(backend, image, self.params, self.seed + ticket.index)
        finally:
            with self._lock:
                self.in_flight -= 1
        if ticket.counted:
            with self._lock:
                self.samples.append(sample)


def sleep_until(t: float) -> None:
    """Sleep until ``time.perf_counter()`` reaches ``t`` (no sleep if it has)."""
    delay = t - time.perf_counter()
    if delay > 0:
        time.sleep(delay)

