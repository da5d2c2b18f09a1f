"""The sweep: check the flags and the server, then warm up and measure each point, scraping the server's metrics
around its counted window; print the table and write the result."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from ocria.bench.results import write_result
from ocria.bench.serve.backends import BackendFactory, backend_factory
from ocria.bench.serve.config import BenchConfig, Load, config_from_args, load_images
from ocria.bench.serve.load import Driver, Window, sleep_until
from ocria.bench.serve.metrics import Scrape, scrape, server_stats
from ocria.bench.serve.report import describe, format_table, plot, point_line, result_dict
from ocria.bench.serve.summary import PointResult, point_result
from ocria.errors import OcriaError


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
            sleep_until(window.measure_start)
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


def _log(line: str) -> None:
    print(line, flush=True)


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

    make_backend = backend_factory(config.backend, config.url, config.timeout_s)
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
        _log(describe(config, load, i))
        point = run_point(config, load, make_backend, images, _log)
        _log(point_line(point))
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
