"""``torch.library`` operator ``ocria::decode_attention`` and the function the attention layers call.
The execution policy picks the Triton kernel or the reference (``policy.uses``); shapes the kernel does not take
(prefill chunks of more than 16 tokens) run the reference."""

import torch
from torch import Tensor

from ocria.plugins.decode_attention.kernel import decode_attention_triton, supports
from ocria.plugins.decode_attention.reference import decode_attention_reference
from ocria.plugins.policy import AUTO, ExecutionPolicy, Launch


@torch.library.custom_op("ocria::decode_attention", mutates_args=())
def _decode_attention_op(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, start: Tensor, attn_len: int,
                         scale: float, causal_block: bool, launch: int) -> Tensor:
    return decode_attention_triton(q, k_cache, v_cache, slots, start, attn_len, scale, causal_block,
                                   launch=Launch(launch))


@_decode_attention_op.register_fake
def _(q, k_cache, v_cache, slots, start, attn_len, scale, causal_block, launch: int):
    B, H, T, D = q.shape
    return q.new_empty(B, T, H, D).transpose(1, 2)


def decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, start: Tensor, attn_len: int,
                     scale: float, causal_block: bool = True, policy: ExecutionPolicy = AUTO) -> Tensor:
    """Attention of T new queries per row over its cache slot; see ``reference.decode_attention_reference``.

    Args:
        q: [B, H, T, D] queries.
        k_cache, v_cache: [S, Hkv, L, D] caches (H a multiple of Hkv).
        slots: [B] long, each row's cache slot.
        start: [B] long, the cache index of each row's first query.
        attn_len: keys read per row at most (the first ``attn_len`` cache entries).
        scale: the softmax scale.
        causal_block: query t sees keys ``j <= start + t``; False: the whole block, ``j < start + T``.
        policy: which implementation runs (``policy.uses``) and how its kernel launches.

    Returns:
        [B, H, T, D] in q's dtype.
    """
    if policy.uses("decode_attention", q.device) and supports(q, k_cache):
        return torch.ops.ocria.decode_attention(q, k_cache, v_cache, slots, start, attn_len, scale, causal_block,
                                                int(policy.launch))
    return decode_attention_reference(q, k_cache, v_cache, slots, start, attn_len, scale, causal_block)
