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

Modules, one job each: ``config`` (flags, the sweep, the documents), ``backends`` (how a request is sent), ``load``
(timing requests, the closed and open loops), ``metrics`` (the server's Prometheus metrics), ``summary`` (a point's
numbers), ``report`` (lines, table, result, plot), ``main`` (the sweep).
"""

from ocria.bench.serve.config import Load, RequestParams, add_args, metrics_url
from ocria.bench.serve.load import Driver, RequestSample, Window, measure_request, poisson_arrivals
from ocria.bench.serve.main import run
from ocria.bench.serve.metrics import counter_delta, histogram_mean, parse_prometheus, server_stats
from ocria.bench.serve.report import format_table
from ocria.bench.serve.summary import point_result, summarize

__all__ = ["Driver", "Load", "RequestParams", "RequestSample", "Window", "add_args", "counter_delta", "format_table",
           "histogram_mean", "measure_request", "metrics_url", "parse_prometheus", "point_result", "poisson_arrivals",
           "run", "server_stats", "summarize"]
