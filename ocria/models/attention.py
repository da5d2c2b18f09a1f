"""Gated full attention of the Qwen3.5 text decoder (output gate, q/k norm, GQA, partial mRoPE)."""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ocria.models.cache import TargetCache
from ocria.models.config import TextConfig
from ocria.models.layers import ZeroCenteredRMSNorm, dense, prologue_dense
from ocria.plugins.decode_attention import decode_attention
from ocria.plugins.gemm_prologue import Prologue
from ocria.plugins.kv_write import kv_write
from ocria.plugins.policy import AUTO, ExecutionPolicy
from ocria.plugins.sigmoid_gate import sigmoid_gate


def cache_index(slots: Tensor, start: Tensor, T: int) -> tuple[Tensor, Tensor]:
    """(slot, sequence index) [B, T] of a call's T tokens written after ``start`` [B]: computed once per
    call when several layers write (the drafter), for the RoPE and every layer's cache write."""
    pos = start.long()[:, None] + torch.arange(T, device=start.device)
    return slots.long()[:, None].expand_as(pos), pos


def cache_position(cache: TargetCache, slots: Tensor, T: int) -> tuple[Tensor, Tensor, Tensor]:
    """(start [B], rows, positions [B, T]) of a step's T new tokens in the target's KV caches: the same for
    every attention layer of the step, so the model computes them once."""
    start = cache.kv_len[slots]
    return start, *cache_index(slots, start, T)


PROJECTIONS = ("q_proj", "k_proj", "v_proj")


class GatedAttention(nn.Module):
    def __init__(self, cfg: TextConfig, cache_index: int):
        super().__init__()
        self.cache_index = cache_index
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        h, bias = cfg.hidden_size, cfg.attention_bias
        self.q_proj = nn.Linear(h, self.num_heads * self.head_dim * 2, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=bias)
        self.q_norm = ZeroCenteredRMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
        self.k_norm = ZeroCenteredRMSNorm(self.head_dim, eps=cfg.rms_norm_eps)

    def forward(self, projections: tuple[Tensor, Tensor, Tensor], cos: Tensor, sin: Tensor,
                cache: TargetCache | None = None, slots: Tensor | None = None, attn_len: int | None = None,
                position: tuple[Tensor, Tensor, Tensor] | None = None, policy: ExecutionPolicy = AUTO) -> Tensor:
        """The layer from its q (with the output gate), k and v projections of the normed input on (the decoder
        layer computes them, folding its norm into their GEMM in decode steps: ``norm_project``). ``position``:
        ``cache_position`` of the step, with a cache (the model computes it once for all its layers).

        Args:
            projections: (q [B, T, 2*H*D] with the gate, k [B, T, Hkv*D], v [B, T, Hkv*D]).
            cos, sin: [B, T, rotary_dim].
            cache: the target cache, or None (no-cache forward).
            slots: [B] long cache slots (with ``cache``).
            attn_len: keys read per row at most (None: the cache's length).
            position: ``cache_position(cache, slots, T)``.
            policy: the execution policy of the plugin ops.

        Returns:
            [B, T, hidden] in the model dtype.
        """
        q, k, v = projections
        B, T, _ = q.shape
        q, gate = q.reshape(B, T, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = self.q_norm.rope(q, cos, sin, policy)
        k = self.k_norm.rope(k.reshape(B, T, self.num_kv_heads, self.head_dim), cos, sin, policy)
        v = v.reshape(B, T, self.num_kv_heads, self.head_dim)
        scale = self.head_dim**-0.5
        if cache is None:
            rep = self.num_heads // self.num_kv_heads
            o = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(rep, dim=1),
                v.transpose(1, 2).repeat_interleave(rep, dim=1), is_causal=True, scale=scale)
        else:
            i = self.cache_index
            start, rows, pos = position
            kv_write(cache.k[i], cache.v[i], k, v, rows, pos, policy=policy)
            o = decode_attention(q.transpose(1, 2), cache.k[i], cache.v[i], slots, start,
                                 attn_len or cache.max_len, scale, policy=policy)
        o = o.transpose(1, 2)
        y = prologue_dense(self.o_proj, Prologue.SIGMOID_GATE, o, gate, policy)  # the gate in o_proj's launch
        return y if y is not None else dense(self.o_proj, sigmoid_gate(o, gate, policy), policy)
