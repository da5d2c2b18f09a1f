"""``ocria bench serve``'s flags and the sweep they describe (``BenchConfig``: loads and request parameters), and the
documents the requests send. Defining the flags imports nothing optional."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

from ocria.errors import OcriaError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
DEFAULT_DURATION_S = 30.0


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

