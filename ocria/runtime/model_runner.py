"""The device side of serving one engine: its caches, its CUDA graphs, prefill and the batched decode step.

The ``Scheduler`` decides which requests run and in which cache slot (host-side bookkeeping only); the
``ModelRunner`` runs them, as nano-vllm's ``LLMEngine.step`` splits schedule → run → postprocess. With CUDA graphs
(``engine.use_graphs``) prefill and decode replay captured graphs, one per bucket; otherwise they run eagerly.
Slot ``max_batch_size`` is a spare that pads graph buckets and is never given to a request.
"""

import torch
from torch import Tensor

from ocria.models import DrafterCache, TargetCache
from ocria.runtime.decode import SamplingTensors, decode_step, prefill_forward, prefill_inputs
from ocria.runtime.graphs import GraphDecoder, PrefillGraphs
from ocria.runtime.processor import PreparedPrompt
from ocria.runtime.sampling import SamplingParams, sample


class ModelRunner:
    """Caches, graphs and forward passes of one engine for up to ``max_batch_size`` sequences.

    Args:
        engine: the ``Engine`` whose target, drafter, processor and profile it runs.
        max_batch_size: sequence slots; default ``engine.max_batch_size``.

    Attributes:
        tcache: the target cache, ``max_batch_size`` slots (+1 spare with CUDA graphs), each ``max_len`` long.
        dcache: the drafter's context cache with the same slots, or None without a drafter.
        max_len: tokens a slot holds: the engine's ``max_seq_len`` plus one verify block.
    """

    def __init__(self, engine, max_batch_size: int | None = None):
        self.engine = engine
        self.max_batch_size = max_batch_size or engine.max_batch_size
        block, dtype, device = engine.block_size, engine.dtype, engine.device
        self.max_len = engine.max_seq_len + block
        slots = self.max_batch_size + int(engine.use_graphs)  # a spare slot pads graph buckets
        self.tcache = TargetCache.allocate(engine.target.text_config, slots, self.max_len, block, dtype, device)
        d = engine.drafter
        self.dcache = None if d is None else DrafterCache.allocate(
            d.config.num_hidden_layers, d.config.num_key_value_heads, d.config.head_dim, slots, self.max_len,
            dtype, device)
        self.decode_graphs = (GraphDecoder(engine.target, d, self.tcache, self.dcache, self.max_batch_size,
                                           self.max_batch_size, engine.policy) if engine.use_graphs else None)
        self.prefill_graphs = (PrefillGraphs(engine.target, d, self.tcache, self.dcache, self.max_batch_size,
                                             engine.prefill_chunk, policy=engine.policy) if engine.use_graphs else None)

    def sampling_tensors(self, params: list[SamplingParams]) -> SamplingTensors:
        """The rows' sampling parameters as [B] device tensors (temperature, top_p float32; top_k, seed long)."""
        dev = self.engine.device
        return SamplingTensors(
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32, device=dev),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=dev),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.long, device=dev),
            seed=torch.tensor([p.seed64 for p in params], dtype=torch.long, device=dev),
        )

    def prefill(self, slot: int, prompt: PreparedPrompt, params: SamplingParams) -> Tensor:
        """Fill ``slot``'s caches with the prompt (the drafter's too when ``params.mode`` is ``spec``) and sample the
        first token.

        Args:
            slot: a free cache slot, ``0 <= slot < max_batch_size``.
            prompt: the prepared prompt (``input_ids`` [L] long, the image's patches).
            params: the request's sampling parameters.

        Returns:
            The first token, [1] long, still on the device: sampled before the next prefill reuses the graph's
            logits buffer, read by the caller with one sync for every prefill of a step.
        """
        engine = self.engine
        spec = params.mode == "spec" and engine.drafter is not None
        inputs = prefill_inputs(engine.target, engine.processor.on_device(prompt, engine.device), engine.device)
        if self.prefill_graphs is not None:
            logits = self.prefill_graphs(slot, inputs, spec)
        else:
            slots = torch.tensor([slot], device=engine.device)
            logits = prefill_forward(engine.target, engine.drafter if spec else None, self.tcache,
                                     self.dcache if spec else None, slots, inputs, engine.prefill_chunk, engine.policy)
        p = self.sampling_tensors([params])
        pos = torch.tensor([prompt.input_ids.numel()], device=engine.device)
        return sample(logits, p.temperature, p.top_p, p.top_k, p.seed, pos, params.temperature == 0)

    def decode(self, slots: list[int], last_tokens: list[int], params: list[SamplingParams], spec: bool,
               attn_len: int, row_ids: tuple) -> tuple[list[list[int]], list[int], list[int]]:
        """One batched decode step: ``spec`` drafts a block and verifies it, ``ar`` decodes one token per row.

        Args:
            slots: the rows' cache slots, [B].
            last_tokens: each row's last token (not yet in the cache), [B].
            params: each row's sampling parameters, [B].
            spec: a speculative step (the engine has a drafter) or a plain one.
            attn_len: the longest row's committed length: attention reads at most this many keys, plus the block.
            row_ids: identifies the batch's composition (e.g. the request ids); while it repeats, the graphs keep
                the sampling tensors they were last given.

        Returns:
            Per row: the step's tokens ([B][block] ints; only the first ``accepted + 1`` count), accepted drafts
            ([B]) and drafts proposed ([B]). The caches have committed the kept tokens.
        """
        engine = self.engine
        greedy = all(p.temperature == 0 for p in params)
        if self.decode_graphs is not None:
            composition = (spec, *row_ids)
            sampling = self.sampling_tensors(params) if composition != self.decode_graphs.composition else None
            out = self.decode_graphs.step(slots, last_tokens, sampling, spec, attn_len, greedy, composition)
        else:
            dev = engine.device
            result = decode_step(engine.target, engine.drafter if spec else None, self.tcache,
                                 self.dcache if spec else None, torch.tensor(slots, device=dev),
                                 torch.tensor(last_tokens, device=dev), self.sampling_tensors(params), attn_len,
                                 greedy, engine.policy)
            out = (result.tokens, result.accepted, result.proposed)
        tokens, accepted, proposed = (x.tolist() for x in out)
        return tokens, accepted, proposed
