"""CUDA graphs of the runtime's steps: the decode step (``GraphDecoder``) and prefill (``PrefillGraphs``).

The decode step is one CUDA graph per (mode, batch bucket, attention-length bucket, greedy).

Everything of a step happens on the GPU inside the graph: drafting, verification, sampling,
acceptance, the cache commit (KV lengths, ring cursors, drafter context) and the next step's
``last`` tokens. The host writes inputs only when the batch composition changes, launches one graph
and reads tokens + accepted counts back with one asynchronous copy into pinned memory.

Rows of a bucket beyond the live batch point at a spare ``pad_slot`` whose state is reset inside the
graph, so padding never touches a live sequence.
"""

import warnings
from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import Tensor

from ocria.models import DrafterCache, OCRiaForConditionalGeneration, TargetCache
from ocria.plugins.policy import AUTO, ExecutionPolicy
from ocria.runtime.decode import PrefillInputs, SamplingTensors, decode_step, prefill_forward

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def bucket(n: int, buckets: Sequence[int]) -> int:
    """The smallest of ``buckets`` (ascending) that is at least ``n``; ValueError beyond the largest."""
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} is beyond the largest bucket {buckets[-1]}")


class GraphDecoder:
    """Decode steps replayed from CUDA graphs, one graph per (batch bucket, spec, attention-length bucket, greedy),
    captured on first use.

    Args:
        target: the target model.
        drafter: the drafter, or None (``ar`` steps only).
        tcache: the target cache the steps read and commit to.
        dcache: the drafter's context cache, or None.
        pad_slot: a cache slot no request uses: the rows of a bucket beyond the live batch point at it.
        max_batch: the most live rows a step has.
        policy: the execution policy the captured steps run under.
    """

    def __init__(self, target: OCRiaForConditionalGeneration, drafter, tcache: TargetCache,
                 dcache: DrafterCache | None, pad_slot: int, max_batch: int, policy: ExecutionPolicy = AUTO):
        self.target, self.drafter, self.tcache, self.dcache = target, drafter, tcache, dcache
        self.policy = policy
        self.pad_slot = pad_slot
        self.max_rows = bucket(max_batch, BATCH_BUCKETS)
        dev = tcache.kv_len.device
        n, t = self.max_rows, (drafter.config.block_size if drafter is not None else 1)
        self.slots = torch.full((n,), pad_slot, dtype=torch.long, device=dev)
        self.last = torch.zeros(n, dtype=torch.long, device=dev)
        self.params = SamplingTensors(torch.zeros(n, device=dev), torch.ones(n, device=dev),
                                      torch.zeros(n, dtype=torch.long, device=dev),
                                      torch.zeros(n, dtype=torch.long, device=dev))
        # a step's results, one row per batch row: tokens [T], then accepted, then proposed
        self.out = torch.zeros(n, t + 2, dtype=torch.long, device=dev)
        self.host_out = torch.zeros(n, t + 2, dtype=torch.long, pin_memory=True)
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.done = torch.cuda.Event()
        self.composition: tuple | None = None
        len_buckets, L = [], 256
        while L < tcache.max_len:
            len_buckets.append(L)
            L *= 2
        self.len_buckets = (*len_buckets, tcache.max_len)

    def _body(self, rows: int, spec: bool, attn_len: int, greedy: bool) -> None:
        """What a graph runs: ``decode_step`` on the first ``rows`` static inputs, its outputs into ``out`` and the
        next step's ``last``, then the pad slot emptied again."""
        p = self.params
        params = SamplingTensors(p.temperature[:rows], p.top_p[:rows], p.top_k[:rows], p.seed[:rows])
        res = decode_step(self.target, self.drafter if spec else None, self.tcache, self.dcache if spec else None,
                          self.slots[:rows], self.last[:rows], params, attn_len, all_greedy=greedy, policy=self.policy)
        T = res.tokens.shape[1]
        self.last[:rows].copy_(res.tokens.gather(1, res.accepted[:, None])[:, 0])
        self.out[:rows, :T].copy_(res.tokens)
        self.out[:rows, -2].copy_(res.accepted)
        self.out[:rows, -1].copy_(res.proposed)
        pad = slice(self.pad_slot, self.pad_slot + 1)
        self.tcache.kv_len[pad].zero_()
        self.tcache.pending_len[pad].zero_()
        if self.dcache is not None:
            self.dcache.ctx_len[pad].zero_()

    def _graph(self, key: tuple) -> torch.cuda.CUDAGraph:
        """The graph of ``key`` = (rows, spec, attn_len, greedy), captured (after two warm-up runs on the pad
        slot) the first time it is asked for."""
        graph = self.graphs.get(key)
        if graph is None:
            rows, spec, attn_len, greedy = key
            saved = (self.slots[:rows].clone(), self.last[:rows].clone())
            self.slots[:rows] = self.pad_slot  # warm-up runs touch only the pad slot
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._body(rows, spec, attn_len, greedy)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self._body(rows, spec, attn_len, greedy)
            self.slots[:rows], self.last[:rows] = saved
            self.graphs[key] = graph
        return graph

    def step(self, slots: list[int], last: list[int], params: SamplingTensors | None, spec: bool,
             attn_len: int, greedy: bool, composition: tuple) -> tuple[Tensor, Tensor, Tensor]:
        """Run one step for the n live rows ``slots``.

        ``composition`` identifies the batch (request ids and modes): inputs are written only when it
        changes, otherwise the graph's own ``last`` update feeds the next step.

        Args:
            slots: the rows' cache slots (n of them).
            last: each row's newest token, not yet seen by the target.
            params: the rows' sampling parameters ([n] each); may be None when ``composition`` is unchanged.
            spec: a ``spec`` step (else ``ar``).
            attn_len: the longest committed length of the rows (bucketed with the block for the graph).
            greedy: whether every row has temperature 0.
            composition: a hashable identity of the batch.

        Returns:
            Host (pinned) tensors tokens [n, T] long, accepted [n] long, proposed [n] long, valid until the next
            step (T = 1 for ``ar``, the drafter's block size for ``spec``).
        """
        n = len(slots)
        rows = bucket(n, BATCH_BUCKETS)
        T = self.drafter.config.block_size if spec else 1
        attn_bucket = bucket(min(attn_len + T, self.tcache.max_len), self.len_buckets)
        key = (rows, spec, attn_bucket, greedy)
        graph = self._graph(key)
        if composition != self.composition:
            dev = self.slots.device
            self.slots[:rows] = self.pad_slot
            self.slots[:n] = torch.tensor(slots, device=dev)
            self.last[:n] = torch.tensor(last, device=dev)
            if params is not None:
                for dst, src in zip((self.params.temperature, self.params.top_p, self.params.top_k,
                                     self.params.seed), (params.temperature, params.top_p, params.top_k, params.seed)):
                    dst[:n] = src
            self.composition = composition
        graph.replay()
        self.host_out[:n].copy_(self.out[:n], non_blocking=True)
        self.done.record()
        self.done.synchronize()
        host = self.host_out[:n]
        return host[:, :T], host[:, -2], host[:, -1]


class PrefillGraphs:
    """Prefill as one CUDA graph per prompt shape (length, image grid, with or without the drafter).

    An eager prefill of a small model is launch-bound: ocria-mini's 171-token page is about 1,750 kernels, ~54 ms of
    host time on the H200, so a server admitting requests one eager prefill at a time tops out near 20 requests/s.
    Replayed from a graph the same kernels cost their GPU time. A shape's graph is captured the second time the
    shape is seen (the first runs eagerly), and the ``max_graphs`` most recently used are kept, so a stream of
    odd-sized pages costs what eager prefill costs and a service reading one page format pays capture once. A replay
    runs the kernels the eager forward runs, on the same shapes: its logits are the eager forward's bit for bit.

    Args:
        target: the target model.
        drafter: the drafter, or None.
        tcache: the target cache prefill writes.
        dcache: the drafter's context cache, or None.
        pad_slot: a cache slot no request uses, where warm-up and capture run.
        chunk: prompt tokens per forward (``prefill_forward``).
        policy: the execution policy the captured prefills run under.
        max_graphs: captured shapes kept, least recently used dropped first.
    """

    def __init__(self, target: OCRiaForConditionalGeneration, drafter, tcache: TargetCache,
                 dcache: DrafterCache | None, pad_slot: int, chunk: int, max_graphs: int = 16,
                 policy: ExecutionPolicy = AUTO):
        self.target, self.drafter, self.tcache, self.dcache = target, drafter, tcache, dcache
        self.policy = policy
        self.pad_slot, self.chunk, self.max_graphs = pad_slot, chunk, max_graphs
        self.slot = torch.full((1,), pad_slot, dtype=torch.long, device=tcache.kv_len.device)
        self.graphs: OrderedDict[tuple, tuple[torch.cuda.CUDAGraph, PrefillInputs, Tensor]] = OrderedDict()
        self.seen: set[tuple] = set()
        self.failed: str | None = None  # why capture failed, if it did (prefill then stays eager)
        self.pool = torch.cuda.graph_pool_handle()

    def __call__(self, slot: int, inputs: PrefillInputs, spec: bool) -> Tensor:
        """Prefill ``inputs`` into ``slot``.

        Args:
            slot: the request's cache slot.
            inputs: the prompt from ``prefill_inputs``.
            spec: also fill the drafter's context.

        Returns:
            Last-position logits [1, V] float32, valid until the next call (a graph's static output).
        """
        key = (spec, *inputs.key)
        entry = self.graphs.get(key)
        if entry is None and (key not in self.seen or self.failed is not None):
            self.seen.add(key)
            self.slot.fill_(slot)
            return self._forward(inputs, spec)
        if entry is None:
            try:
                entry = self._capture(inputs, spec)
            except RuntimeError as e:  # a kernel this torch cannot capture: prefill stays eager, and says so once
                self.failed = f"{type(e).__name__}: {e}".splitlines()[0]
                warnings.warn(f"prefill CUDA graphs are off, every prefill runs eagerly: {self.failed}", stacklevel=2)
                self.slot.fill_(slot)
                return self._forward(inputs, spec)
            self.graphs[key] = entry
            if len(self.graphs) > self.max_graphs:
                self.graphs.popitem(last=False)
        self.graphs.move_to_end(key)
        graph, static, logits = entry
        for dst, src in ((static.ids, inputs.ids), (static.positions, inputs.positions), (static.delta, inputs.delta),
                         (static.pixel_values, inputs.pixel_values)):
            if dst is not None:
                dst.copy_(src)
        self.slot.fill_(slot)
        graph.replay()
        return logits

    def _forward(self, inputs: PrefillInputs, spec: bool) -> Tensor:
        drafter = self.drafter if spec else None
        return prefill_forward(self.target, drafter, self.tcache, self.dcache if spec else None, self.slot, inputs,
                               self.chunk, self.policy)

    def _capture(self, inputs: PrefillInputs, spec: bool) -> tuple[torch.cuda.CUDAGraph, PrefillInputs, Tensor]:
        static = PrefillInputs(*(None if t is None else t.clone() for t in (
            inputs.ids, inputs.pixel_values, inputs.grid, inputs.positions, inputs.delta)))
        self.slot.fill_(self.pad_slot)  # warm-up and capture touch only the pad slot
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._forward(static, spec)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self._forward(static, spec)
        self.tcache.reset(self.slot)  # leave the pad slot empty, as the decode graphs expect it
        if self.dcache is not None:
            self.dcache.reset(self.slot)
        return graph, static, logits
