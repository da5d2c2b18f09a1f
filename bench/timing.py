"""Shared GPU timing for the kernel benchmarks."""

import statistics

import torch


def time_calls(fns: list, min_calls: int = 20, replays: int = 15) -> float:
    """Median µs per call of a CUDA graph that runs the closures round-robin (>= min_calls calls)."""
    reps = max(1, -(-min_calls // len(fns)))
    calls = fns * reps
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for f in calls:
            f()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return statistics.median(times)
