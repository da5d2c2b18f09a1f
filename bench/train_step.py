"""What one target training step of ``python -m ocria.train`` costs: ops dispatched per phase, activation
bytes kept for backward, and (on CUDA) wall time per step and peak memory for several batch sizes.

A step of a small model dispatches thousands of tiny kernels; when the Python side issuing them is the
bottleneck, the step time barely grows with the batch and a bigger batch is nearly free throughput.
``--profile`` adds the GPU kernel time per step (wall time well above it: the host is the bottleneck)
and the top kernels; ``--loader`` the batches per second the data workers deliver and the time of a
batch's copy to the GPU, the two costs of the training loop that the step itself does not include.

    python bench/train_step.py --device cpu --batch 4 16 --out bench/results/train_step_cpu.json
    python bench/train_step.py --batch 64 128 256 --out bench/results/train_step_h200.json
    python bench/train_step.py --batch 256 --profile --loader 12 --out bench/results/train_step_h200_profile.json
"""

import argparse
import collections
import datetime as dt
import statistics
import sys
import time

import torch
from inert_ops import INERT_OPS
from torch.utils._python_dispatch import TorchDispatchMode

from ocria.bench.results import write_json
from ocria.bench.timing import kernel_table
from ocria.builder.presets import load_preset
from ocria.train.data import loader
from ocria.train.gdn_chunked import chunked_gdn
from ocria.train.optim import FlatAdamW
from ocria.train.target import build_target, target_loss
from ocria.train.vision_batched import batched_vision


class OpCounter(TorchDispatchMode):
    """Counts the ATen ops that would launch a kernel, by name."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in INERT_OPS:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def step_parts(model, opt, batch, device: str):
    """The training loop's step (ocria.train.run.Run._loop) as three closures: forward, backward, update."""
    autocast = torch.autocast("cuda", torch.bfloat16, enabled=device == "cuda")
    state = {}

    def forward():
        with autocast, chunked_gdn(), batched_vision():
            state["loss"] = target_loss(model, batch)

    def backward():
        opt.zero_grad()
        state["loss"].backward()

    def update():
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return forward, backward, update


def saved_bytes(forward) -> int:
    """Bytes of the distinct storages autograd keeps for backward."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward()
    return sum(storages.values())


def profile_step(forward, backward, update, steps: int = 2) -> dict:
    """GPU kernel time per step (all kernels, memcpys included) and the 12 biggest kernels."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            forward()
            backward()
            update()
        torch.cuda.synchronize()
    table = kernel_table(prof)
    return {"gpu_kernel_ms_per_step": table["total_kernel_us"] / steps / 1e3,
            "kernels_per_step": table["kernels"] / steps,
            "top": [dict(r, total_us=r["total_us"] / steps) for r in table["all_kernels"][:12]]}


def loader_rate(preset, batch_size: int, workers: int, batches: int = 8) -> dict:
    """Batches per second the training loader delivers once its workers are running (nothing else
    competing), and the copy of one of its (pinned) batches to the GPU."""
    it = iter(loader(preset.assets, batch_size, 0, workers))
    batch = next(it)  # workers started, first batches rendered
    t0 = time.perf_counter()
    for _ in range(batches):
        batch = next(it)
    rate = batches / (time.perf_counter() - t0)
    copies = []
    for _ in range(3):
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        batch.to("cuda")
        torch.cuda.synchronize()
        copies.append(time.perf_counter() - t1)
    del it
    return {"workers": workers, "batches_per_s": rate, "documents_per_s": rate * batch_size,
            "pinned": batch.pixel_bytes.is_pinned(), "batch_MB": sum(
                t.numel() * t.element_size() for t in vars(batch).values()) / 1e6,
            "copy_to_gpu_ms": statistics.median(copies) * 1e3}


def measure(preset, batch_size: int, device: str, steps: int, profile: bool, workers: int) -> dict:
    model = build_target(preset.target, preset.seed).to(device)
    opt = FlatAdamW(model, 1e-4, 0.05)
    batches = loader(preset.assets, batch_size, 100, 4 if device == "cuda" else 0)
    it = iter(batches)
    batch = next(it).to(device)
    forward, backward, update = step_parts(model, opt, batch, device)
    row = {"batch": batch_size, "seq_len": int(batch.input_ids.shape[1]), "patches": int(batch.pixel_bytes.shape[0])}
    counts = {}
    for name, part in (("forward", forward), ("backward", backward), ("update", update)):
        with OpCounter() as counter:
            part()
        counts[name] = sum(counter.ops.values())
    row["ops"] = counts
    row["ops_per_step"] = sum(counts.values())
    row["saved_GB"] = saved_bytes(forward) / 1e9
    backward()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        times = []
        for i in range(steps + 3):  # the same batch each step: the loader's speed is not measured here
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            forward()
            backward()
            update()
            torch.cuda.synchronize()
            if i >= 3:
                times.append(time.perf_counter() - t0)
        row["step_ms"] = statistics.median(times) * 1e3
        row["documents_per_s"] = batch_size / statistics.median(times)
        row["peak_GB"] = torch.cuda.max_memory_allocated() / 1e9
        if profile:
            row["profile"] = profile_step(forward, backward, update)
    del it, batches
    if workers and device == "cuda":
        row["loader"] = loader_rate(preset, batch_size, workers)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="ocria-mini")
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--steps", type=int, default=10, help="timed steps per batch size (CUDA)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--profile", action="store_true", help="GPU kernel time per step and top kernels (CUDA)")
    ap.add_argument("--loader", type=int, default=0, metavar="WORKERS",
                    help="also time the training loader with this many workers and a batch's copy (CUDA)")
    ap.add_argument("--out", default="bench/results/train_step_h200.json")
    args = ap.parse_args()
    torch.manual_seed(0)
    preset = load_preset(args.preset)
    result = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        "command": " ".join(["python"] + sys.argv),
        "torch": torch.__version__,
        "preset": args.preset,
        "rows": [],
    }
    heads = ("batch", "seq", "ops fwd/bwd/upd", "saved GB", "step ms", "docs/s", "peak GB")
    print(" ".join(f"{h:>{w}}" for h, w in zip(heads, (6, 5, 18, 9, 8, 8, 8))))
    for b in args.batch:
        row = measure(preset, b, args.device, args.steps, args.profile, args.loader)
        result["rows"].append(row)
        write_json(result, args.out)
        ops = "/".join(str(row["ops"][k]) for k in ("forward", "backward", "update"))
        print(f"{b:>6} {row['seq_len']:>5} {ops:>18} {row['saved_GB']:>9.2f} {row.get('step_ms', float('nan')):>8.1f} "
              f"{row.get('documents_per_s', float('nan')):>8.0f} {row.get('peak_GB', float('nan')):>8.1f}")
        if "profile" in row:
            p = row["profile"]
            top = ", ".join(f"{k['kernel'][:40]} {k['total_us'] / 1e3:.1f} ms" for k in p["top"][:4])
            print(f"       GPU kernels {p['gpu_kernel_ms_per_step']:.1f} ms/step in {p['kernels_per_step']:.0f} "
                  f"kernels; top: {top}")
        if "loader" in row:
            ld = row["loader"]
            print(f"       loader ({ld['workers']} workers) {ld['batches_per_s']:.2f} batches/s = "
                  f"{ld['documents_per_s']:.0f} docs/s; batch {ld['batch_MB']:.0f} MB, pinned {ld['pinned']}, "
                  f"copy to GPU {ld['copy_to_gpu_ms']:.1f} ms")


if __name__ == "__main__":
    main()
