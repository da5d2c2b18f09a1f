"""The kernel profile of ``--profile`` (CUDA): every kernel of one eager ar step and one eager oracle step at batch
1, the oracle step split into drafter and target verify + commit."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ocria.bench.engine.decode import drafter_cache, greedy_params
from ocria.bench.engine.models import Models
from ocria.bench.engine.oracle import ForcedDrafter

if TYPE_CHECKING:
    from ocria.runtime.processor import PreparedPrompt


class DrafterRanges:
    """A drafter whose step calls run inside profiler ranges ``drafter.<method>``, so a profile can
    tell the drafter's kernels from the target's without touching the model code."""

    METHODS = ("draft", "propose", "verify_budget", "append_context")

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name not in self.METHODS:
            return attr

        def ranged(*a, **kw):
            import torch

            with torch.profiler.record_function(f"drafter.{name}"):
                return attr(*a, **kw)

        return ranged


def profile_steps(models: Models, prompt: PreparedPrompt) -> dict:
    """Every CUDA kernel of one eager ar step and one eager oracle step (draft + verify + commit) at
    batch 1: where the time inside the graph goes, and which small kernels are left to fuse.

    Args:
        models: what the run benchmarks (with a drafter).
        prompt: the document prompt the steps follow.
    Returns:
        ``{"ar": ..., "oracle": ...}``: each step's kernel count and time, its kernels (``top``: the 20 longest),
        and for oracle the drafter's share (by profiler range) and the target's.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    from ocria.bench.timing import kernel_table
    from ocria.models import TargetCache
    from ocria.runtime.decode import decode_step, prefill

    target, drafter, dev = models.target, models.drafter, models.device
    L = prompt.input_ids.numel()
    slot = torch.zeros(1, dtype=torch.long, device=dev)
    params = greedy_params(1, dev)
    table = torch.zeros(1, L + 256, dtype=torch.long, device=dev)  # the wanted tokens do not change the kernels
    out = {}
    for mode in ("ar", "oracle"):
        spec = mode != "ar"
        tcache = TargetCache.allocate(target.text_config, 1, L + 256, drafter.config.block_size, models.dtype, dev)
        dcache = drafter_cache(drafter, 1, L + 256, models.dtype, dev) if spec else None
        use = DrafterRanges(ForcedDrafter(drafter, table, None)) if spec else None
        last = prefill(target, drafter if spec else None, tcache, dcache, 0, prompt, policy=models.policy).argmax(-1)
        for _ in range(3):
            decode_step(target, use, tcache, dcache, slot, last, params, L + 64, True, models.policy)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            decode_step(target, use, tcache, dcache, slot, last, params, L + 64, True, models.policy)
            torch.cuda.synchronize()
        ranges = tuple(f"drafter.{m}" for m in DrafterRanges.METHODS) if spec else ()
        out[mode] = step_profile(kernel_table(prof, ranges), spec)
        print_profile(mode, out[mode])
        del tcache, dcache
    return out


def step_profile(table: dict, spec: bool) -> dict:
    """One step's profile from its ``kernel_table``; a speculative step's split into drafter and target."""
    r = {"total_kernel_us": table["total_kernel_us"], "kernels": table["kernels"]}
    if spec:
        drafter_us = sum(x["total_us"] for x in table["ranges"].values())
        drafter_n = sum(x["kernels"] for x in table["ranges"].values())
        r.update(drafter_us=drafter_us, drafter_kernels=drafter_n,
                 target_verify_commit_us=r["total_kernel_us"] - drafter_us,
                 target_verify_commit_kernels=r["kernels"] - drafter_n, ranges=table["ranges"])
    r.update(top=table["all_kernels"][:20], all_kernels=table["all_kernels"])
    return r


def print_profile(mode: str, r: dict) -> None:
    """A step's profile as printed: totals, the drafter/target split, the longest kernels."""
    split = (f"; drafter {r['drafter_kernels']} kernels {r['drafter_us'] / 1e3:.3f} ms, target verify + commit "
             f"{r['target_verify_commit_kernels']} kernels {r['target_verify_commit_us'] / 1e3:.3f} ms"
             if "drafter_us" in r else "")
    print(f"eager {mode} step (B=1): {r['kernels']} kernels, {r['total_kernel_us'] / 1e3:.3f} ms of kernel time"
          + split, flush=True)
    for k in r["top"]:
        print(f"  {k['total_us']:9.1f} us  {k['calls']:4d}x  {k['kernel'][:90]}", flush=True)
