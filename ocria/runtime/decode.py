"""Batched prefill and decode steps on explicit slot state (tensors in, tensors out).

A decode step for rows ``slots`` whose last token (not yet seen by the target) is ``last``:

- ``ar``: the target runs [last] and samples one token.
- ``spec``: the drafter drafts Bs-1 tokens; the target verifies [last, drafts] in one forward and
  samples its own token y_j at every position; drafts are accepted while they equal y_j, plus the
  bonus y_n. Tokens are position-keyed (``sampling.sample``), so the output equals ``ar``'s.

The target runs both inside ``batch_invariant_rows()``: its kernels then compute a token's logits the same way
in a 16-token verify block of many sequences as in a one-token step alone, so ``spec``'s greedy tokens are
``ar``'s bit for bit (``OCRIA_BATCH_INVARIANT=0``: faster kernels, equal up to floating-point near-ties).

Both then commit the kept prefix with one cursor move (``TargetCache.commit``); ``spec`` also
injects the kept tokens' target features into the drafter's context.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from ocria.models import DFlash2Drafter, DrafterCache, OCRiaForConditionalGeneration, TargetCache
from ocria.plugins.switch import batch_invariant_rows
from ocria.runtime.processor import PreparedPrompt
from ocria.runtime.sampling import sample


@dataclass
class SamplingTensors:
    """Per-row sampling parameters on the device ([B] each)."""

    temperature: Tensor
    top_p: Tensor
    top_k: Tensor
    seed: Tensor


@dataclass
class StepResult:
    tokens: Tensor  # [B, T] target tokens y_0..y_{T-1}; row b emits tokens[b, :accepted[b] + 1]
    accepted: Tensor  # [B] accepted drafts (0 in ar mode)
    proposed: Tensor  # [B] drafts offered for verification (0 in ar mode)


@torch.no_grad()
def prefill(target: OCRiaForConditionalGeneration, drafter: DFlash2Drafter | None, tcache: TargetCache,
            dcache: DrafterCache | None, slot: int, prompt: PreparedPrompt, chunk: int = 512) -> Tensor:
    """Run a prompt (image + text) into an empty slot in chunks; returns last-position logits [1, V]."""
    device = tcache.kv_len.device
    slots = torch.tensor([slot], device=device)
    tcache.reset(slots)
    if dcache is not None:
        dcache.reset(slots)
    ids = prompt.input_ids[None].to(device)
    grid = prompt.image_grid_thw.to(device)
    embeds = target.embed(ids, prompt.pixel_values.to(device), grid)
    positions, delta = target.positions(ids, grid)
    tcache.rope_delta[slots] = delta.to(device)
    capture = tuple(drafter.config.target_layer_ids) if drafter is not None else ()
    length = ids.shape[1]
    for start in range(0, length, chunk):
        end = min(start + chunk, length)
        hidden, feats = target.forward_cached(embeds[:, start:end], positions[:, :, start:end], tcache, slots,
                                              "prefill", capture=capture, attn_len=end)
        tcache.kv_len[slots] = end
        if drafter is not None:
            drafter.append_context(torch.cat(feats, -1), torch.tensor([end - start], device=device), dcache, slots)
    return target.logits(hidden[:, -1])


@torch.no_grad()
def decode_step(target: OCRiaForConditionalGeneration, drafter: DFlash2Drafter | None, tcache: TargetCache,
                dcache: DrafterCache | None, slots: Tensor, last: Tensor, params: SamplingTensors,
                attn_len: int, all_greedy: bool | None = None) -> StepResult:
    """One ``ar`` (drafter None) or ``spec`` step for rows ``slots`` [B] with last tokens ``last`` [B].

    No host synchronisation when ``all_greedy`` is given: the step can be captured in a CUDA graph.
    """
    B = slots.shape[0]
    budget = None
    if drafter is not None:
        draft_logits, conf = drafter.draft(last, dcache, slots, attn_len=attn_len + drafter.config.block_size)
        drafts = drafter.propose(draft_logits, dcache, slots)
        block = torch.cat([last[:, None], drafts], dim=1)
        budget = drafter.verify_budget(conf)
    else:
        block = last[:, None]
    T = block.shape[1]
    index = tcache.kv_len[slots].long()[:, None] + torch.arange(T, device=slots.device)
    positions = (index + tcache.rope_delta[slots][:, None]).expand(3, B, T)
    capture = tuple(drafter.config.target_layer_ids) if drafter is not None else ()
    with batch_invariant_rows():  # a token's logits do not depend on the block or batch it is computed in
        hidden, feats = target.forward_cached(target.text.embed_tokens(block), positions, tcache, slots, "verify",
                                              capture=capture, attn_len=attn_len + T)
        logits = target.logits(hidden)
    tokens = sample(logits, params.temperature, params.top_p, params.top_k, params.seed, index + 1, all_greedy)
    if drafter is None:
        accepted = torch.zeros(B, dtype=torch.long, device=slots.device)
        proposed = accepted
    else:
        accepted = (drafts == tokens[:, :-1]).long().cumprod(dim=1).sum(dim=1)
        proposed = torch.full_like(accepted, T - 1)
        if budget is not None:
            proposed = budget.long()
            accepted = torch.minimum(accepted, proposed)
    tcache.commit(slots, accepted + 1)
    if drafter is not None:
        drafter.append_context(torch.cat(feats, -1), accepted + 1, dcache, slots)
    return StepResult(tokens, accepted, proposed)
