"""What one request costs before its first token, offline: image preprocessing, prefill (eager, and replayed from
its CUDA graph on a GPU) and the first token's sampling. A served request's time to first token is judged against
this sum. On a GPU the graph replay is also checked against the eager prefill: logits and cache state bit for bit.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_ms(fn: Callable[[], object], device, repeats: int = 20) -> float:
    """Median wall milliseconds of ``fn`` after one warm-up call, the device synchronised around each call."""
    import torch

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def measure_prefill(models, image: bytes, chunk: int) -> dict:
    """Offline time to first token of ``image`` with the benchmark's models, and (CUDA) the graph replay's exactness.

    Args:
        models: ``ocria.bench.engine.models.Models`` (target, drafter, processor, device).
        image: the document's encoded bytes.
        chunk: prefill chunk length (the engine profile's).
    Returns:
        dict of milliseconds (``prepare_ms``, ``prefill_eager_ms``, ``prefill_graph_ms`` or None on CPU,
        ``sample_ms``, ``ttft_offline_ms``), the prompt length, and ``graph_equals_eager`` (None on CPU).
    """
    import torch

    from ocria.models import DrafterCache, TargetCache
    from ocria.runtime.decode import prefill_forward, prefill_inputs
    from ocria.runtime.graphs import PrefillGraphs
    from ocria.runtime.sampling import sample

    target, drafter, proc, device = models.target, models.drafter, models.processor, models.device
    prepare_ms = median_ms(lambda: proc.prepare(image, as_bytes=True), torch.device("cpu"))
    inputs = prefill_inputs(target, proc.on_device(proc.prepare(image, as_bytes=True), device), device)
    block = drafter.config.block_size if drafter is not None else 1
    length = inputs.ids.shape[1] + block
    tcache = TargetCache.allocate(target.text_config, 2, length, block, models.dtype, device)
    dcache = None if drafter is None else DrafterCache.allocate(
        drafter.config.num_hidden_layers, drafter.config.num_key_value_heads, drafter.config.head_dim, 2, length,
        models.dtype, device)
    slots = torch.zeros(1, dtype=torch.long, device=device)

    def eager():
        return prefill_forward(target, drafter, tcache, dcache, slots, inputs, chunk, models.policy)

    result = {"prompt_tokens": int(inputs.ids.shape[1]), "prepare_ms": prepare_ms,
              "prefill_eager_ms": median_ms(eager, device), "prefill_graph_ms": None, "graph_equals_eager": None}
    logits = eager()
    zero = torch.zeros(1, device=device)
    result["sample_ms"] = median_ms(lambda: int(sample(logits, zero, zero + 1, zero.long(), zero.long(),
                                                       zero.long())[0]), device)
    prefill_ms = result["prefill_eager_ms"]
    if device.type == "cuda":
        graphs = PrefillGraphs(target, drafter, tcache, dcache, pad_slot=1, chunk=chunk, policy=models.policy)
        want = eager().clone()
        state = [t[0].clone() for t in (*tcache.k, *tcache.ssm, *(dcache.k if dcache else []))]
        got = [graphs(0, inputs, drafter is not None).clone() for _ in range(3)]  # eager sighting, capture, replay
        same_state = all(torch.equal(t[0], s) for t, s in zip((*tcache.k, *tcache.ssm, *(dcache.k if dcache else [])),
                                                               state))
        result["graph_equals_eager"] = graphs.failed is None and same_state and all(torch.equal(g, want) for g in got)
        result["graph_failed"] = graphs.failed
        result["prefill_graph_ms"] = median_ms(lambda: graphs(0, inputs, drafter is not None), device)
        prefill_ms = result["prefill_graph_ms"]
    result["ttft_offline_ms"] = result["prepare_ms"] + prefill_ms + result["sample_ms"]
    return result
