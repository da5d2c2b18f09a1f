"""``ocria bench serve``: a load generator against a running ocria server, in the manner of ``vllm bench serve``.

Each sweep point drives the server either in a closed loop (``--concurrency N``: N streams, each sending its next
request when the previous one finishes) or in an open loop (``--request-rate R``: Poisson arrivals at R requests/s,
at most ``--max-concurrency`` in flight). A point first runs ``--warmup`` seconds whose requests are not counted,
then counts the requests it *starts* until ``--duration`` has passed or ``--requests`` have been sent; requests in
flight at the end are waited for and counted (so the point's wall time runs to the last of them).

Client side, per point: completed requests and errors, requests/s, output tokens/s, TTFT (send to the first chunk
with text or tokens), end-to-end latency, inter-token latency (the time between two chunks divided by the tokens in
the later one; streaming only) and tokens per request. Tokens are counted from the token ids the server sends; a
server that sends none gives null token numbers, never estimates. Server side, from its Prometheus metrics scraped
at the start and the end of the counted window: generated tokens, mean engine batch size, mean server TTFT, mean
acceptance length, requests finished by reason, the share of the window the engine loop spent prefilling and
decoding, and the preprocessing model's compute and queue time per request (null for any family the server does not
export): where a server's time goes, stage by stage. The server's
numbers cover the scrape window, so they include warmup requests still running when it opens (with ``--warmup 0``
they match the client's requests exactly).

Requests go through a ``Backend`` (``--backend triton``: the ``ocria`` ensemble over gRPC; ``--backend openai``: OpenAI
chat completions over HTTP, e.g. ``ocria serve --frontend dynamo``); the measurement code only sees the chunks it
yields, so both paths are measured alike.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import random
import re
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Protocol

from ocria.bench.results import result_header, write_result
from ocria.errors import OcriaError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DEFAULT_DURATION_S = 30.0
MAX_ERROR_MESSAGES = 5
PROGRESS_EVERY_S = 5.0


# ---------------------------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class RequestParams:
    """What every request asks for (``None``: the server's default)."""

    stream: bool = True
    max_tokens: int | None = None
    temperature: float | None = None
    prompt: str | None = None


@dataclass(frozen=True)
class Load:
    """One sweep point: a closed loop of ``concurrency`` streams, or Poisson arrivals at ``request_rate``/s."""

    concurrency: int | None = None
    request_rate: float | None = None

    @property
    def label(self) -> str:
        return f"c={self.concurrency}" if self.concurrency is not None else f"rate={self.request_rate:g}/s"


@dataclass(frozen=True)
class BenchConfig:
    """The whole sweep, from the command line."""

    url: str
    metrics_url: str | None
    images: Path
    loads: tuple[Load, ...]
    max_concurrency: int
    duration_s: float | None
    requests: int | None
    warmup_s: float
    params: RequestParams
    seed: int
    timeout_s: float
    out: Path
    backend: str = "triton"  # triton | openai

    @property
    def sweep(self) -> str:
        """``concurrency`` or ``request_rate``: what the sweep varies."""
        return "concurrency" if self.loads[0].concurrency is not None else "request_rate"


# ---------------------------------------------------------------------------------------------------------------
# Backends: how a request is sent. The measurement code sees only ``Reply`` objects.


class Reply(Protocol):
    """One response of a request: its new text and the token ids new in it (empty if the server sends none)."""

    text: str
    token_ids: list[int]
    finish_reason: str | None


class Backend(Protocol):
    """Sends requests to one server; each sending thread gets its own instance (``BackendFactory``)."""

    name: str

    def check(self) -> None:
        """Raise OcriaError (one line, naming the server) unless the server is up and serving the model."""

    def send(self, image: bytes, params: RequestParams, seed: int) -> Iterator[Reply]:
        """Send one request; yield its responses until the last; raise OcriaError if it fails."""


BackendFactory = Callable[[], Backend]


class TritonBackend:
    """The ``ocria`` ensemble of a Triton Inference Server over gRPC (``ocria.serving.client``)."""

    name = "triton-grpc"

    def __init__(self, url: str, timeout_s: float):
        """Args:
            url: the server's gRPC address HOST:PORT.
            timeout_s: seconds to wait for each response of a request.
        """
        from ocria.serving.client import Client

        self.url = url
        self.timeout_s = timeout_s
        self._client = Client(url, timeout_s)

    def check(self) -> None:
        """Raise OcriaError unless the server at ``url`` is live and its ``ocria`` model is ready."""
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        from ocria.serving import ENSEMBLE

        timeout = min(self.timeout_s, 10.0)
        try:
            client = grpcclient.InferenceServerClient(self.url)
        except (InferenceServerException, ValueError) as e:
            raise OcriaError(f"--url {self.url}: not a gRPC address HOST:PORT ({_one_line(e)})") from None
        try:
            try:
                live = client.is_server_live(client_timeout=timeout)
            except InferenceServerException as e:
                raise OcriaError(f"cannot reach a Triton server at {self.url} ({_one_line(e)})") from None
            if not live:
                raise OcriaError(f"the Triton server at {self.url} is not live")
            if not client.is_model_ready(ENSEMBLE, client_timeout=timeout):
                raise OcriaError(f"the Triton server at {self.url} has no ready model '{ENSEMBLE}'")
        finally:
            client.close()

    def send(self, image: bytes, params: RequestParams, seed: int) -> Iterator[Reply]:
        """Yield the ensemble's chunks (``ocria.serving.client.Chunk``) for one request."""
        return self._client.generate(image, prompt=params.prompt, stream=params.stream, max_tokens=params.max_tokens,
                                     temperature=params.temperature, seed=seed)


@dataclass
class ChatReply:
    """One chunk of an OpenAI chat completion."""

    text: str
    token_ids: list[int]
    finish_reason: str | None


def _image_type(image: bytes) -> str:
    if image.startswith(b"\x89PNG"):
        return "image/png"
    if image.startswith(b"\xff\xd8"):
        return "image/jpeg"
    if image[:4] == b"RIFF" and image[8:12] == b"WEBP":
        return "image/webp"
    return "application/octet-stream"


class OpenAIBackend:
    """An OpenAI-compatible ``/v1/chat/completions`` server (``ocria serve --frontend dynamo``): the image goes as a
    data URI. Token ids come from each chunk's ``nvext.token_ids`` (ocria's Dynamo workers send them); a server that
    sends none gives null token numbers."""

    name = "openai-chat"

    def __init__(self, url: str, timeout_s: float, model: str = "ocria"):
        """Args:
            url: the server's base URL, http://HOST:PORT (http:// is added to a bare HOST:PORT).
            timeout_s: seconds to wait for each response of a request.
            model: the ``model`` of each request.
        """
        self.url = (url if "://" in url else f"http://{url}").rstrip("/")
        self.timeout_s = timeout_s
        self.model = model

    def check(self) -> None:
        """Raise OcriaError unless ``/v1/models`` of the server lists ``model``."""
        try:
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=min(self.timeout_s, 10.0)) as r:
                models = [m.get("id") for m in json.loads(r.read()).get("data", [])]
        except (OSError, ValueError) as e:
            raise OcriaError(f"cannot reach an OpenAI-compatible server at {self.url} ({_one_line(e)})") from None
        if self.model not in models:
            raise OcriaError(f"the server at {self.url} serves no model '{self.model}' (it lists {models})")

    def send(self, image: bytes, params: RequestParams, seed: int) -> Iterator[Reply]:
        """Yield the chunks of one chat completion (one for a non-streaming request)."""
        content = [{"type": "image_url", "image_url": {
            "url": f"data:{_image_type(image)};base64,{base64.b64encode(image).decode()}"}}]
        if params.prompt is not None:
            content.insert(0, {"type": "text", "text": params.prompt})
        body = {"model": self.model, "messages": [{"role": "user", "content": content}], "stream": params.stream,
                "seed": seed}
        if params.max_tokens is not None:
            body["max_tokens"] = params.max_tokens
        if params.temperature is not None:
            body["temperature"] = params.temperature
        request = urllib.request.Request(f"{self.url}/v1/chat/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as r:
                if not params.stream:
                    yield self._reply(json.loads(r.read()), "message")
                    return
                for line in r:
                    data = line.decode("utf-8").strip()
                    if not data.startswith("data:"):
                        continue
                    data = data[len("data:"):].strip()
                    if data == "[DONE]":
                        return
                    yield self._reply(json.loads(data), "delta")
        except urllib.error.HTTPError as e:
            raise OcriaError(f"HTTP {e.code}: {_error_message(e.read())}") from None
        except (OSError, ValueError) as e:
            raise OcriaError(f"{self.url}: {_one_line(e)}") from None

    @staticmethod
    def _reply(chunk: dict, part: str) -> ChatReply:
        if "error" in chunk:
            raise OcriaError(_error_message(json.dumps(chunk)))
        choice = (chunk.get("choices") or [{}])[0]
        ids = (chunk.get("nvext") or {}).get("token_ids") or []
        return ChatReply((choice.get(part) or {}).get("content") or "", list(ids), choice.get("finish_reason"))


def _error_message(body: bytes | str) -> str:
    """The message of an OpenAI-style error body (``{"error": {"message"}}`` or ``{"message"}``)."""
    try:
        doc = json.loads(body)
        error = doc.get("error", doc)
        return _one_line(str(error.get("message", error)))
    except (ValueError, AttributeError):
        return _one_line(body.decode("utf-8", "replace") if isinstance(body, bytes) else body)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


# ---------------------------------------------------------------------------------------------------------------
# Measuring requests


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
            if not (reply.text or n):
                continue
            if previous is None:
                sample.ttft_s = now - start
            elif n:
                sample.itl_s.append((now - previous) / n)
            previous = now
    except OcriaError as e:
        sample.error = _one_line(e) or type(e).__name__
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
            _sleep_until(arrival)
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


def _sleep_until(t: float) -> None:
    delay = t - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


# ---------------------------------------------------------------------------------------------------------------
# Summaries


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


# ---------------------------------------------------------------------------------------------------------------
# Server metrics (Prometheus text format)


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
        raise OcriaError(f"cannot read server metrics at {url} ({_one_line(e)})") from None


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
        preprocess_queue_ms=_per_request_ms(before, after, "nv_inference_queue_duration_us", "preprocessing"))


# ---------------------------------------------------------------------------------------------------------------
# One sweep point


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
        finish_reasons=reasons, server=server)


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


def run_point(config: BenchConfig, load: Load, make_backend: BackendFactory, images: Sequence[bytes],
              log: Callable[[str], None]) -> PointResult:
    """Warm up, then measure one sweep point, scraping the server's metrics around the counted window.

    Args:
        config: the sweep.
        load: this point.
        make_backend: a new Backend for each sending thread.
        images: the documents.
        log: where progress lines go.
    Returns:
        The point's result.
    """
    window = Window(config.warmup_s, config.duration_s, config.requests)
    driver = Driver(make_backend, images, config.params, config.seed, window)
    driver.start(load, config.max_concurrency)
    try:
        if config.warmup_s > 0:
            _sleep_until(window.measure_start)
            log(f"  warmup done ({config.warmup_s:g}s, {driver.in_flight} in flight); measuring")
        before = _try_scrape(config.metrics_url, log)

        def tick():
            elapsed = time.perf_counter() - window.measure_start
            log(f"  {elapsed:6.1f}s  sent {window.sent}  done {len(driver.samples)}  in flight {driver.in_flight}")

        samples = driver.join(tick)
    except KeyboardInterrupt:
        window.stop()
        raise
    now = time.perf_counter()
    after = _try_scrape(config.metrics_url, log) if before is not None else None
    server = (server_stats(before, after, now - window.measure_start) if before is not None and after is not None
              else None)
    cap = config.max_concurrency if load.request_rate is not None else None
    return point_result(load, cap, samples, window.measure_start, now, server)


def _try_scrape(url: str | None, log: Callable[[str], None]) -> Scrape | None:
    if url is None:
        return None
    try:
        return scrape(url)
    except OcriaError as e:
        log(f"  warning: {e}; this point's server numbers are null")
        return None


# ---------------------------------------------------------------------------------------------------------------
# Output


def _fmt(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def _pair(summary: Summary | None, scale: float, digits: int) -> str:
    if summary is None:
        return "-"
    return f"{_fmt(summary.p50, scale, digits)}/{_fmt(summary.p99, scale, digits)}"


TABLE_COLUMNS = (("load", 12), ("done", 6), ("err", 5), ("req/s", 8), ("out tok/s", 10), ("TTFT p50/p99 ms", 16),
                 ("E2E p50/p99 s", 14), ("ITL p50 ms", 11), ("tok/req", 8), ("batch", 6), ("accept", 7),
                 ("srv TTFT ms", 12), ("prefill/decode busy", 20), ("pre ms", 7))


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
            _fmt(s.mean_ttft_s if s else None, 1e3, 1), _busy(s), _fmt(s.preprocess_ms if s else None, digits=2)]


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


# ---------------------------------------------------------------------------------------------------------------
# Command line


def add_args(p: argparse.ArgumentParser) -> None:
    """``ocria bench serve``'s flags (imports nothing optional)."""
    p.add_argument("--backend", choices=("triton", "openai"), default="triton",
                   help="triton: the ocria ensemble over gRPC; openai: OpenAI chat completions over HTTP "
                        "(ocria serve --frontend dynamo) (default: %(default)s)")
    p.add_argument("--url", help="triton: the gRPC address HOST:PORT (default: 127.0.0.1:8001); openai: the base URL "
                                 "http://HOST:PORT (default: http://127.0.0.1:8000)")
    p.add_argument("--metrics-url",
                   help="server Prometheus metrics URL (default: triton: http://HOST:8002/metrics, HOST from --url; "
                        "openai: none)")
    p.add_argument("--no-metrics", action="store_true", help="do not scrape the server's metrics")
    p.add_argument("--images", help="directory of document images (.png .jpg .jpeg .webp); requests cycle through "
                   "them (default: the repository's examples/)")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, nargs="+", metavar="N",
                      help="closed-loop sweep: N streams, each sending its next request when the previous ends "
                           "(default: 1 8 32 64)")
    load.add_argument("--request-rate", type=float, nargs="+", metavar="R",
                      help="open-loop sweep: Poisson arrivals at R requests/s")
    p.add_argument("--max-concurrency", type=int, default=256,
                   help="open loop: most requests in flight at once (default: %(default)s)")
    p.add_argument("--duration", type=float,
                   help=f"seconds of counted requests per point (default: {DEFAULT_DURATION_S:g}, or unlimited "
                        "with --requests)")
    p.add_argument("--requests", type=int, help="counted requests per point (with --duration: whichever ends first)")
    p.add_argument("--warmup", type=float, default=3.0, help="uncounted seconds before each point (default: 3)")
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True,
                   help="the requests' stream flag (default: streaming)")
    p.add_argument("--max-tokens", type=int, help="each request's max_tokens (default: the server's)")
    p.add_argument("--temperature", type=float, help="each request's temperature (default: the server's)")
    p.add_argument("--prompt", help="instruction (default: the engine's OCR prompt)")
    p.add_argument("--seed", type=int, default=0, help="request i of a point gets seed + i (default: 0)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for each response (default: 600)")
    p.add_argument("--out", default="bench-serve.json", help="result JSON; the plot goes beside it as .png")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """Check the flags and turn them into a BenchConfig; OcriaError (one line) for bad values.

    Args:
        args: parsed ``add_args`` flags.
    Returns:
        The config.
    """
    loads = _loads(args.concurrency, args.request_rate)
    if args.duration is not None:
        _check(args.duration > 0, f"--duration must be > 0, got {args.duration:g}")
    _check(args.requests is None or args.requests >= 1, f"--requests must be >= 1, got {args.requests}")
    _check(args.warmup >= 0, f"--warmup must be >= 0, got {args.warmup:g}")
    _check(args.max_concurrency >= 1, f"--max-concurrency must be >= 1, got {args.max_concurrency}")
    _check(args.timeout > 0, f"--timeout must be > 0, got {args.timeout:g}")
    _check(args.max_tokens is None or args.max_tokens >= 1, f"--max-tokens must be >= 1, got {args.max_tokens}")
    _check(args.seed >= 0, f"--seed must be >= 0, got {args.seed}")
    duration = args.duration if args.duration is not None or args.requests is not None else DEFAULT_DURATION_S
    openai = args.backend == "openai"
    url = args.url or ("http://127.0.0.1:8000" if openai else "127.0.0.1:8001")
    scraped = not args.no_metrics and not (openai and args.metrics_url is None)
    metrics = metrics_url(url, args.metrics_url) if scraped else None
    params = RequestParams(args.stream, args.max_tokens, args.temperature, args.prompt)
    return BenchConfig(url, metrics, Path(args.images) if args.images else EXAMPLES, loads,
                       args.max_concurrency, duration, args.requests, args.warmup, params, args.seed, args.timeout,
                       Path(args.out), args.backend)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise OcriaError(message)


def _loads(concurrency: list[int] | None, rates: list[float] | None) -> tuple[Load, ...]:
    if rates is not None:
        for r in rates:
            _check(math.isfinite(r) and r > 0, f"--request-rate must be a finite number > 0, got {r:g}")
        return tuple(Load(request_rate=r) for r in rates)
    for c in concurrency or ():
        _check(c >= 1, f"--concurrency must be >= 1, got {c}")
    return tuple(Load(concurrency=c) for c in (concurrency or (1, 8, 32, 64)))


def metrics_url(grpc_url: str, given: str | None) -> str:
    """The metrics endpoint: ``given`` completed with http:// and /metrics, else port 8002 of ``grpc_url``'s host.

    Args:
        grpc_url: the server's gRPC HOST:PORT.
        given: ``--metrics-url``, if any (HOST:PORT, a URL, or a URL with a path).
    Returns:
        A full URL.
    """
    if given is None:
        host = grpc_url.rsplit(":", 1)[0] if ":" in grpc_url else grpc_url
        return f"http://{host}:8002/metrics"
    url = given if "://" in given else f"http://{given}"
    if "/" not in url.split("://", 1)[1]:
        url += "/metrics"
    return url


def load_images(directory: Path) -> list[bytes]:
    """The bytes of every image in ``directory`` (a single image file is accepted too), sorted by name.

    Args:
        directory: where the documents are.
    Returns:
        Their bytes; OcriaError if there are none or they cannot be read.
    """
    if directory.is_file():
        paths = [directory]
    elif directory.is_dir():
        try:
            paths = sorted(p for p in directory.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        except OSError as e:
            raise OcriaError(f"--images {directory}: cannot read the directory ({e.strerror or e})") from None
    else:
        raise OcriaError(f"--images {directory}: no such directory")
    if not paths:
        raise OcriaError(f"--images {directory}: no images ({' '.join(IMAGE_SUFFIXES)}) in it")
    try:
        return [p.read_bytes() for p in paths]
    except OSError as e:
        raise OcriaError(f"--images: cannot read {e.filename} ({e.strerror or e})") from None


def _log(line: str) -> None:
    print(line, flush=True)


def _describe(config: BenchConfig, load: Load, i: int) -> str:
    limit = " and ".join(x for x in (f"{config.duration_s:g}s" if config.duration_s is not None else "",
                                     f"{config.requests} requests" if config.requests is not None else "") if x)
    what = (f"{load.concurrency} concurrent stream{'s' * (load.concurrency != 1)}" if load.concurrency is not None
            else f"{load.request_rate:g} requests/s (Poisson, at most {config.max_concurrency} in flight)")
    return f"[{i + 1}/{len(config.loads)}] {what}: warmup {config.warmup_s:g}s, measuring up to {limit}"


def _point_line(p: PointResult) -> str:
    tokens = "" if p.output_tokens_per_s is None else f", {p.output_tokens_per_s:.1f} out tok/s"
    ttft = "" if p.ttft_s is None else f", TTFT p50 {p.ttft_s.p50 * 1e3:.1f} ms"
    errors = f"; errors: {' | '.join(p.error_messages)}" if p.errors else ""
    return (f"  {p.completed} done, {p.errors} failed in {p.wall_s:.1f}s: {p.requests_per_s:.2f} req/s"
            f"{tokens}{ttft}{errors}")


def run(args: argparse.Namespace) -> int:
    """``ocria bench serve``: check the flags and the server, run the sweep, print the table, write the result.

    Args:
        args: parsed ``add_args`` flags.
    Returns:
        0, or 1 if no request completed at all.
    """
    from ocria.deps import require

    config = config_from_args(args)
    if config.backend == "triton":
        require("tritonclient.grpc", "serve", "ocria bench serve")
    images = load_images(config.images)

    def make_backend() -> Backend:
        if config.backend == "openai":
            return OpenAIBackend(config.url, config.timeout_s)
        return TritonBackend(config.url, config.timeout_s)

    backend = make_backend()
    backend.check()
    if config.metrics_url is not None:
        try:
            scrape(config.metrics_url)
        except OcriaError as e:
            _log(f"warning: {e}; server-side numbers will be null (--no-metrics skips them)")
            config = replace(config, metrics_url=None)
    _log(f"ocria bench serve: {config.url} ({backend.name}), {len(images)} images, "
         f"{'streaming' if config.params.stream else 'not streaming'}, max_tokens "
         f"{config.params.max_tokens or 'server default'}")
    points = []
    for i, load in enumerate(config.loads):
        _log(_describe(config, load, i))
        point = run_point(config, load, make_backend, images, _log)
        _log(_point_line(point))
        points.append(point)
    print()
    print(format_table(points), flush=True)
    out = write_result(result_dict(config, backend.name, points), config.out, plot)
    print(f"\nresult written to {out} (plot: {out.with_suffix('.png')})")
    if not any(p.completed for p in points):
        first = next((m for p in points for m in p.error_messages), "no request was sent")
        print(f"ocria bench serve: no request completed ({first})", file=sys.stderr)
        return 1
    return 0
