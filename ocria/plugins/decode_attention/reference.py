"""PyTorch reference: gather each row's slot, repeat KV heads for GQA, masked SDPA.

The gather and the head repeat are copies of the slot's whole KV prefix per layer and step, and the
mask is built with several more ops; the kernel reads the cache where it lies instead.
"""

import torch
import torch.nn.functional as F
from torch import Tensor


def decode_attention_reference(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, start: Tensor,
                               attn_len: int, scale: float, causal_block: bool = True) -> Tensor:
    """q [B, H, T, D] attends to the first ``attn_len`` entries of cache slot ``slots[b]`` ([S, Hkv, L, D]).
    Query t sees keys ``j <= start[b] + t`` (causal) or ``j < start[b] + T`` (bidirectional block)."""
    B, H, T, _ = q.shape
    attn_len = min(attn_len, k_cache.shape[2])
    keys = k_cache[slots, :, :attn_len]
    values = v_cache[slots, :, :attn_len]
    rep = H // keys.shape[1]
    keys, values = keys.repeat_interleave(rep, dim=1), values.repeat_interleave(rep, dim=1)
    j = torch.arange(attn_len, device=q.device)
    t = torch.arange(T, device=q.device)
    limit = start.long()[:, None] + (t[None, :] if causal_block else T - 1)
    mask = j[None, None, :] <= limit[:, :, None]
    return F.scaled_dot_product_attention(q, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask[:, None],
                                          scale=scale)
