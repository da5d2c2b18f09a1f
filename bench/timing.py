"""Shared GPU timing, error measure and result writing for the benchmarks."""

import json
import os
import statistics
import sys
import time

import torch


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Max abs difference over the reference's max magnitude (one number per tensor)."""
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30))


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
    save_json(result, path)
    print(json.dumps({"ok": result["ok"], "seconds": round(result["seconds"], 1)}))
    if not result["ok"]:
        sys.exit(1)


def save_json(result: dict, path: str) -> None:
    """Write a result file whole or not at all (temp file, then rename): benches save after every row."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(path + ".tmp", path)


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
