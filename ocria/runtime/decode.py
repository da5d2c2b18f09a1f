"""Batched prefill and decode steps on explicit slot state (tensors in, tensors out).

A decode step for rows ``slots`` whose last token (not yet seen by the target) is ``last``:

- ``ar``: the target runs [last] and samples one token.
- ``spec``: the drafter drafts Bs-1 tokens; the target verifies [last, drafts] in one forward and
  samples its own token y_j at every position; drafts are accepted while they equal y_j, plus the
  bonus y_n. Tokens are position-keyed (``sampling.sample``), so the output equals ``ar``'s.

The target runs both under ``policy.for_steps()``: its kernels then compute a token's logits the same way in a
16-token verify block of many sequences as in a one-token step alone, so ``spec``'s greedy tokens are ``ar``'s bit
for bit (a policy without ``batch_invariant``: faster kernels, equal up to floating-point near-ties).

Both then commit the kept prefix with one cursor move (``TargetCache.commit``); ``spec`` also
injects the kept tokens' target features into the drafter's context. The rollback contract these steps follow is
defined in ``ocria.models.cache``.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from ocria.errors import RequestError
from ocria.models import DFlash2Drafter, DrafterCache, OCRiaForConditionalGeneration, TargetCache
from ocria.plugins.policy import AUTO, ExecutionPolicy
from ocria.runtime.processor import PreparedPrompt
from ocria.runtime.sampling import sample


@dataclass
class SamplingTensors:
    """Per-row sampling parameters on the device ([B] each)."""

    temperature: Tensor  # [B] float32; 0 = greedy
    top_p: Tensor  # [B] float32; 1 = off
    top_k: Tensor  # [B] long; 0 = off
    seed: Tensor  # [B] long (``SamplingParams.seed64``)


@dataclass
class StepResult:
    """A decode step's tokens, on the device (T = 1 in ``ar`` mode, the drafter's block size in ``spec``)."""

    tokens: Tensor  # [B, T] long target tokens y_0..y_{T-1}; row b emits tokens[b, :accepted[b] + 1]
    accepted: Tensor  # [B] long accepted drafts (0 in ar mode)
    proposed: Tensor  # [B] long drafts offered for verification (0 in ar mode)


@dataclass
class PrefillInputs:
    """One prompt, ready for ``prefill_forward``: what it needs from the host is computed here, so the forward
    itself never waits on the device (it can be captured in a CUDA graph)."""

    ids: Tensor  # [1, T] long, on the device
    pixel_values: Tensor | None  # [P, C*Tp*p*p] float pixel values on the device
    grid: Tensor | None  # [1, 3] long on the CPU: the vision encoder reads its sizes on the host
    positions: Tensor  # [3, 1, T] long mRoPE ids, on the device
    delta: Tensor  # [1] long: text position offset after the image, on the device

    @property
    def key(self) -> tuple:
        """What the shapes of a prefill depend on: (prompt length T, image grid (t, h, w) or None)."""
        return self.ids.shape[1], None if self.grid is None else tuple(self.grid.reshape(-1).tolist())


def prefill_inputs(target: OCRiaForConditionalGeneration, prompt: PreparedPrompt,
                   device: torch.device) -> PrefillInputs:
    """Check a prompt's image tokens against its image and lay it out for ``prefill_forward`` on ``device``
    (pixel values already on the device, as ``Processor.on_device`` gives them, stay where they are).

    Args:
        target: the target model (its mRoPE positions and image token id).
        prompt: ``input_ids`` [T] long, ``pixel_values`` [P, C*Tp*p*p] float or None, ``image_grid_thw`` [1, 3].
        device: where the forward runs.

    Returns:
        ``PrefillInputs`` with ids [1, T], positions [3, 1, T] and delta [1] on ``device``, the grid on the CPU.
        RequestError if the prompt's image tokens do not match the image's embeddings.
    """
    ids, grid = prompt.input_ids[None], prompt.image_grid_thw
    if grid is not None:
        grid = grid.cpu()
        merge = target.config.vision.spatial_merge_size
        want = int(grid.prod(-1).sum()) // merge**2
        have = int((ids == target.config.image_token_id).sum())
        if have != want:
            raise RequestError(f"prompt has {have} image tokens but the image gives {want} embeddings")
    positions, delta = target.positions(ids.cpu(), grid)
    pixels = prompt.pixel_values.to(device) if prompt.pixel_values is not None else None
    return PrefillInputs(ids.to(device), pixels, grid, positions.to(device), delta.to(device))


def prefill_forward(target: OCRiaForConditionalGeneration, drafter: DFlash2Drafter | None, tcache: TargetCache,
                    dcache: DrafterCache | None, slots: Tensor, inputs: PrefillInputs, chunk: int = 512,
                    policy: ExecutionPolicy = AUTO) -> Tensor:
    """Run a prompt into the slot ``slots`` (reset first) in chunks of ``chunk`` tokens. No host
    synchronisation: the call can be captured in a CUDA graph.

    Args:
        target: the target model.
        drafter: also fill the drafter's context with the prompt's target features; None for ``ar``.
        tcache: the target cache; the slot's KV, SSM state and rope delta are written.
        dcache: the drafter's context cache (with ``drafter``), else None.
        slots: [1] long, the slot, on the device.
        inputs: the prompt from ``prefill_inputs``.
        chunk: prompt tokens per forward.
        policy: the execution policy of the models' plugin ops.

    Returns:
        Logits [1, V] float32 at the prompt's last position.
    """
    tcache.reset(slots)
    if dcache is not None:
        dcache.reset(slots)
    embeds = target.embed(inputs.ids, inputs.pixel_values, inputs.grid, check=False)
    tcache.rope_delta[slots] = inputs.delta
    capture = tuple(drafter.config.target_layer_ids) if drafter is not None else ()
    length = inputs.ids.shape[1]
    for start in range(0, length, chunk):
        end = min(start + chunk, length)
        hidden, feats = target.forward_cached(embeds[:, start:end], inputs.positions[:, :, start:end], tcache, slots,
                                              "prefill", capture=capture, attn_len=end, policy=policy)
        tcache.kv_len.index_fill_(0, slots, end)  # a fill, not a host-to-device copy: capturable
        if drafter is not None:
            counts = torch.full((1,), end - start, dtype=torch.long, device=slots.device)
            drafter.append_context(torch.cat(feats, -1), counts, dcache, slots, policy)
    return target.logits(hidden[:, -1], policy)


@torch.no_grad()
def prefill(target: OCRiaForConditionalGeneration, drafter: DFlash2Drafter | None, tcache: TargetCache,
            dcache: DrafterCache | None, slot: int, prompt: PreparedPrompt, chunk: int = 512,
            policy: ExecutionPolicy = AUTO) -> Tensor:
    """Run a prompt (image + text) into slot ``slot`` in chunks: ``prefill_inputs`` then ``prefill_forward``.

    Returns:
        Logits [1, V] float32 at the prompt's last position.
    """
    device = tcache.kv_len.device
    slots = torch.tensor([slot], device=device)
    return prefill_forward(target, drafter, tcache, dcache, slots, prefill_inputs(target, prompt, device), chunk,
                           policy)


@torch.no_grad()
def decode_step(target: OCRiaForConditionalGeneration, drafter: DFlash2Drafter | None, tcache: TargetCache,
                dcache: DrafterCache | None, slots: Tensor, last: Tensor, params: SamplingTensors,
                attn_len: int, all_greedy: bool | None = None, policy: ExecutionPolicy = AUTO) -> StepResult:
    """One ``ar`` (drafter None) or ``spec`` step for rows ``slots``; commits the kept tokens to the caches.

    No host synchronisation when ``all_greedy`` is given: the step can be captured in a CUDA graph.

    Args:
        target: the target model.
        drafter: the drafter for a ``spec`` step; None for ``ar``.
        tcache: the target cache; the rows' committed lengths advance by ``accepted + 1``.
        dcache: the drafter's context cache (with ``drafter``), else None.
        slots: [B] long cache slots, on the device.
        last: [B] long, each row's newest token, not yet seen by the target.
        params: the rows' sampling parameters ([B] each).
        attn_len: at least the longest committed length of the rows (the longest, or a CUDA graph's bucket):
            attention reads ``attn_len + T`` keys per row, those past a row's length masked.
        all_greedy: whether every row has temperature 0, if known on the host; None checks on the device.
        policy: the execution policy of the models' plugin ops; the target's forward runs under
            ``policy.for_steps()``, so a token's logits do not depend on the block or batch it is computed in.

    Returns:
        ``StepResult``: tokens [B, T] long, accepted [B] long, proposed [B] long (T = 1 for ``ar``, the
        drafter's block size for ``spec``).
    """
    B = slots.shape[0]
    budget = None
    if drafter is not None:
        draft_logits, conf = drafter.draft(last, dcache, slots, attn_len=attn_len + drafter.config.block_size,
                                           policy=policy)
        drafts = drafter.propose(draft_logits, dcache, slots)
        block = torch.cat([last[:, None], drafts], dim=1)
        budget = drafter.verify_budget(conf)
    else:
        block = last[:, None]
    T = block.shape[1]
    index = tcache.kv_len[slots].long()[:, None] + torch.arange(T, device=slots.device)
    positions = (index + tcache.rope_delta[slots][:, None]).expand(3, B, T)
    capture = tuple(drafter.config.target_layer_ids) if drafter is not None else ()
    step = policy.for_steps()
    hidden, feats = target.forward_cached(target.text.embed_tokens(block), positions, tcache, slots, "verify",
                                          capture=capture, attn_len=attn_len + T, policy=step)
    logits = target.logits(hidden, step)
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
        drafter.append_context(torch.cat(feats, -1), accepted + 1, dcache, slots, policy)
    return StepResult(tokens, accepted, proposed)
