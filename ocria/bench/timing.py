"""Shared GPU timing, error measure and profile tables for the benchmarks (``ocria bench`` and ``bench/*.py``).

Results are written with ``ocria.bench.results.write_json`` (whole or not at all); ``finish`` closes a checked
benchmark script with it.
"""

import json
import math
import statistics
import sys
import time

import torch

from ocria.bench.results import write_json


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Max abs difference over the reference's max magnitude (one number per tensor)."""
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30))


GRAPH_US = 2000.0  # a timed graph runs at least this long (time_calls)
MAX_CALLS = 4096  # and holds at most this many calls
ROTATE_BYTES = 256 << 20  # rotating inputs at least this large: past the H100's and H200's 50 MB L2 several times
MAX_COPIES = 64


def rotation_copies(bytes_per_call: int) -> int:
    """How many copies of one call's inputs to rotate through so that together they pass ``ROTATE_BYTES`` (and come
    from HBM, as in a decode step, not from L2); at most ``MAX_COPIES``."""
    return max(1, min(MAX_COPIES, -(-ROTATE_BYTES // max(1, bytes_per_call))))


def rotating_calls(fn, inputs: list) -> list:
    """Closures ``fn(inputs[i])`` that each keep their call's outputs until their next call, so the outputs rotate
    over as many buffers as the inputs (as a copy's rotating destinations do). Left to the graph's pool, every call
    would write one buffer that stays in L2 from one call to the next and is overwritten there: the write-back to
    HBM that a bytes floor counts would never be paid, and a kernel would look faster than its floor allows."""
    held = [None] * len(inputs)

    def call(i: int) -> None:
        held[i] = fn(inputs[i])

    return [lambda i=i: call(i) for i in range(len(inputs))]


def capture_graph(calls: list) -> torch.cuda.CUDAGraph:
    """A CUDA graph of the closures in order, replayed once."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for f in calls:
            f()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def median_us(run, calls: int, replays: int) -> float:
    """Median over ``replays`` timed runs of ``run`` (a graph's replay, or eager calls) of its µs per call."""
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def graph_reps(n_fns: int, min_calls: int, per_call_us: float | None = None, min_graph_us: float = GRAPH_US) -> int:
    """Rounds of ``n_fns`` closures in a timed graph: at least ``min_calls`` calls, and, given a first estimate of a
    call's µs, enough calls (up to about ``MAX_CALLS``) that one replay runs ``min_graph_us``."""
    reps = max(1, -(-min_calls // n_fns))
    if per_call_us:
        want = min(MAX_CALLS, math.ceil(min_graph_us / per_call_us))
        reps = max(reps, -(-want // n_fns))
    return reps


def time_calls(fns: list, min_calls: int = 20, replays: int = 15, min_graph_us: float = GRAPH_US) -> float:
    """Median µs per call of a CUDA graph that runs the closures round-robin (``graph_reps`` rounds of them). Why
    graphs of ``min_graph_us``: a replay's own launch is timed with its calls (a few µs on an H200), which over a
    couple of dozen calls of a 10 µs kernel adds a measurable fraction of a µs to each; a long graph spreads it
    over enough calls to vanish, as a model's step graph spreads it over hundreds of kernels."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(stream)
    reps = graph_reps(len(fns), min_calls)
    graph = capture_graph(fns * reps)
    if min_graph_us > 0:
        more = graph_reps(len(fns), min_calls, median_us(graph.replay, len(fns) * reps, 3), min_graph_us)
        if more > reps:
            del graph
            reps = more
            graph = capture_graph(fns * reps)
    return median_us(graph.replay, len(fns) * reps, replays)


def copy_bandwidth() -> float:
    """Bytes/s of a 2 GiB device-to-device copy (read + write), eager, median of 10 after warm-up."""
    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(10):
        start.record()
        y.copy_(x)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del x, y
    return 2 * (2 << 30) / statistics.median(times)


def finish(result: dict, rows: list[dict], t0: float, path: str) -> None:
    """Close a checked benchmark: ``ok`` (every row's check), wall seconds, final save, one JSON line;
    exit code 1 when a check failed."""
    result["ok"] = all(r["ok"] for r in rows)
    result["seconds"] = time.time() - t0
    write_json(result, path)
    print(json.dumps({"ok": result["ok"], "seconds": round(result["seconds"], 1)}))
    if not result["ok"]:
        sys.exit(1)


def _kernels_under(event, skip: tuple[str, ...]) -> tuple[int, float]:
    """(count, us) of the device kernels launched inside a CPU event and its children, without the GPU
    mirrors of profiler ranges (named like the ranges)."""
    own = [k for k in event.kernels if k.name not in skip]
    n, us = len(own), sum(k.duration for k in own)
    for child in event.cpu_children:
        cn, cus = _kernels_under(child, skip)
        n, us = n + cn, us + cus
    return n, us


def kernel_table(prof, ranges: tuple[str, ...] = ()) -> dict:
    """Every device kernel (and memcpy/memset) of a profile by name, plus the kernels launched inside
    each CPU range named in ``ranges``."""
    from torch.autograd import DeviceType

    per_name: dict[str, list] = {}
    for e in prof.events():
        if e.device_type != DeviceType.CPU and not e.is_user_annotation and e.name not in ranges:
            entry = per_name.setdefault(e.name, [0, 0.0])
            entry[0] += 1
            entry[1] += e.device_time_total
    kernels = sorted(({"kernel": k, "calls": c, "total_us": t} for k, (c, t) in per_name.items()),
                     key=lambda r: -r["total_us"])
    split = {}
    for name in ranges:
        hits = [_kernels_under(e, ranges) for e in prof.events() if e.name == name and e.device_type == DeviceType.CPU]
        split[name] = {"kernels": sum(h[0] for h in hits), "total_us": sum(h[1] for h in hits)}
    return {"total_kernel_us": sum(r["total_us"] for r in kernels), "kernels": sum(r["calls"] for r in kernels),
            "ranges": split, "all_kernels": kernels}
