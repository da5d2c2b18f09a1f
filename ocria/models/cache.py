"""Slot-based inference state: every sequence owns one slot in preallocated tensors.

Nothing is allocated per step and rollback is a length / cursor move, so a decode step has fixed
shapes (the GPU path captures it in a CUDA graph). Per slot ``s``:

- attention layers: ``k[l][s], v[l][s]`` [Hkv, max_len, D]; ``kv_len[s]`` committed tokens.
- GDN layers: ``conv_buf[l][s]`` [K-1+Tmax, C] raw conv inputs, ``ssm[l][s]`` [Hv, Dk, Dv] fp32
  checkpoint state, and the ReplaySSM ring (``ring_k/u/g``) with the shared ``ring_phase`` and
  ``pending_len`` cursor (see ``ocria.models.gdn``).
- ``rope_delta[s]``: mRoPE offset of text positions after the image (position = index + delta).
- the drafter (``DrafterCache``): context K/V per layer and ``ctx_len[s]`` tokens injected.

Rollback contract (the one place it is defined; kernels and the runtime follow it). A step of T tokens on slot
``s`` (T = 1 for ``ar``, the block for ``spec``):

1. Reads: attention sees ``kv_len[s]`` committed keys; a GDN layer first folds the ``pending_len[s]`` tokens
   parked in ring half ``ring_phase[s]`` into ``ssm[s]``, and takes its conv window at offset ``pending_len[s]``
   of ``conv_buf[s]``.
2. Writes, for all T tokens, past every cursor: K/V rows from ``kv_len[s]`` on, the T tokens' ``k, u, g`` in the
   other ring half, their conv inputs after the window. Nothing committed is overwritten, so dropping any suffix
   of the T tokens needs no undo.
3. ``TargetCache.commit(slots, kept)``, once for all layers: ``kv_len += kept``, ``ring_phase ^= 1``,
   ``pending_len = kept``. The kept tokens are folded by the next step (1).
4. The drafter's ``ctx_len[s]`` grows only by the kept tokens' features (``DFlash2Drafter.inject``); what a draft
   wrote beyond it is overwritten by the next one.

A new sequence starts from ``reset`` (all cursors and states zero); prefill writes its prompt in chunks and sets
``kv_len`` to the prompt's length. In the runtime, ``decode_step`` (``ocria.runtime.decode``) is the one caller of
``commit``.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from ocria.models.config import FULL, LINEAR, TextConfig


def cache_tensors(cache: "TargetCache | DrafterCache") -> list[Tensor]:
    """Every tensor of a cache (each indexed by slot first)."""
    return [t for v in vars(cache).values() for t in (v if isinstance(v, list) else [v]) if isinstance(t, Tensor)]


def cache_bytes(cache: "TargetCache | DrafterCache") -> int:
    """Bytes held by a cache's tensors (allocate it on ``meta`` to size a configuration for free)."""
    return sum(t.numel() * t.element_size() for t in cache_tensors(cache))


@dataclass
class TargetCache:
    """The target's per-slot state (S slots; shapes as the module docstring gives them, slot first)."""

    k: list[Tensor]  # per attention layer [S, Hkv, max_len, D], model dtype
    v: list[Tensor]  # per attention layer [S, Hkv, max_len, D], model dtype
    conv_buf: list[Tensor]  # per GDN layer [S, K-1+max_chunk, C] raw conv inputs, model dtype
    ssm: list[Tensor]  # per GDN layer [S, Hv, Dk, Dv] fp32 state up to the committed, folded tokens
    ring_k: list[Tensor]  # per GDN layer [S, 2, max_chunk, Hk, Dk] fp32: the last steps' keys, two halves
    ring_u: list[Tensor]  # per GDN layer [S, 2, max_chunk, Hv, Dv] fp32: their delta-rule writes
    ring_g: list[Tensor]  # per GDN layer [S, 2, max_chunk, Hv] fp32: their log-decays
    kv_len: Tensor  # [S] int32 committed tokens
    ring_phase: Tensor  # [S] int32: the ring half holding the pending tokens
    pending_len: Tensor  # [S] int32 accepted tokens not yet folded into ``ssm``
    rope_delta: Tensor  # [S] long mRoPE offset of text positions after the image
    max_len: int
    max_chunk: int

    @classmethod
    def allocate(
        cls,
        cfg: TextConfig,
        num_slots: int,
        max_len: int,
        max_chunk: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> "TargetCache":
        """Preallocate zeroed state for ``num_slots`` sequences of up to ``max_len`` tokens.

        Args:
            cfg: the target's text config (layer types and head sizes).
            num_slots: S.
            max_len: tokens per sequence, prompt included.
            max_chunk: the most tokens one verify step (``T``) appends.
            dtype: dtype of the KV and conv buffers (the GDN state and ring are fp32).
            device: where to allocate (``meta`` sizes a configuration for free).

        Returns:
            The cache, every slot empty.
        """
        n_full = cfg.layer_types.count(FULL)
        n_lin = cfg.layer_types.count(LINEAR)
        hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        conv_dim = 2 * hk * dk + hv * dv
        width = cfg.linear_conv_kernel_dim - 1 + max_chunk
        f32 = dict(dtype=torch.float32, device=device)

        def zeros(shape, **kw):
            return torch.zeros(shape, **(kw or dict(dtype=dtype, device=device)))

        kv_shape = (num_slots, cfg.num_key_value_heads, max_len, cfg.head_dim)
        return cls(
            k=[zeros(kv_shape) for _ in range(n_full)],
            v=[zeros(kv_shape) for _ in range(n_full)],
            conv_buf=[zeros((num_slots, width, conv_dim)) for _ in range(n_lin)],
            ssm=[zeros((num_slots, hv, dk, dv), **f32) for _ in range(n_lin)],
            ring_k=[zeros((num_slots, 2, max_chunk, hk, dk), **f32) for _ in range(n_lin)],
            ring_u=[zeros((num_slots, 2, max_chunk, hv, dv), **f32) for _ in range(n_lin)],
            ring_g=[zeros((num_slots, 2, max_chunk, hv), **f32) for _ in range(n_lin)],
            kv_len=torch.zeros(num_slots, dtype=torch.int32, device=device),
            ring_phase=torch.zeros(num_slots, dtype=torch.int32, device=device),
            pending_len=torch.zeros(num_slots, dtype=torch.int32, device=device),
            rope_delta=torch.zeros(num_slots, dtype=torch.long, device=device),
            max_len=max_len,
            max_chunk=max_chunk,
        )

    def reset(self, slots: Tensor) -> None:
        """Empty the slots ``slots`` [B] long (a new sequence starts from zero state). ``index_fill_`` writes the
        zeros with no host-to-device copy, so a CUDA graph can capture it."""
        for t in (*self.conv_buf, *self.ssm, self.kv_len, self.pending_len, self.ring_phase, self.rope_delta):
            t.index_fill_(0, slots, 0)

    def commit(self, slots: Tensor, accepted: Tensor) -> None:
        """After a step: keep ``accepted`` [B] of the step's tokens per slot ``slots`` [B], drop the rest (step 3 of
        the module's rollback contract).

        One cursor move for all layers: attention lengths grow, the ring halves swap and the
        pending count becomes the accepted count (folded into the state at the next step).
        """
        accepted = accepted.to(torch.int32)
        self.kv_len[slots] += accepted
        self.ring_phase[slots] ^= 1
        self.pending_len[slots] = accepted


@dataclass
class DrafterCache:
    """Drafter context K/V per layer [S, Hkv, max_len, D] and the committed context length."""

    k: list[Tensor]  # per drafter layer [S, Hkv, max_len, D]
    v: list[Tensor]  # per drafter layer [S, Hkv, max_len, D]
    ctx_len: Tensor  # [S] int32 context tokens injected

    @classmethod
    def allocate(cls, num_layers: int, num_kv_heads: int, head_dim: int, num_slots: int, max_len: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu") -> "DrafterCache":
        """Zeroed context caches of ``num_layers`` layers for ``num_slots`` sequences of up to ``max_len``
        tokens ([num_slots, num_kv_heads, max_len, head_dim] each, in ``dtype``)."""
        shape = (num_slots, num_kv_heads, max_len, head_dim)
        return cls(
            k=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)],
            v=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)],
            ctx_len=torch.zeros(num_slots, dtype=torch.int32, device=device),
        )

    def reset(self, slots: Tensor) -> None:
        """Empty the slots ``slots`` [B] long (capturable, as ``TargetCache.reset``)."""
        self.ctx_len.index_fill_(0, slots, 0)
