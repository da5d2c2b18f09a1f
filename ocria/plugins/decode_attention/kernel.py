"""Triton kernel: one program per (batch row, KV head) runs all its query heads and new tokens
(``T * H / Hkv`` query rows) over the row's cache slot with an online softmax (flash-attention
style), so the KV prefix is read once per KV head, in place, with no gather, head repeat or mask
tensor. The query-row tile and the key loop are the same for every T up to 16, so a token decoded
alone (``ar``) and inside a verify block runs the same arithmetic.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from ocria.errors import OcriaError
from ocria.plugins.rounding import bf16_as_int16, bf16_bits, widen

MAX_T = 16  # decode and verify blocks; longer (prefill) chunks take the reference


@triton.jit
def _decode_attention_kernel(
    q_ptr, k_ptr, v_ptr, slot_ptr, start_ptr, o_ptr,
    sq_b, sq_h, sq_t, sk_s, sk_h, sk_l, sv_s, sv_h, sv_l,
    T, H, attn_len, scale,
    REP: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
    CAUSAL: tl.constexpr, PREC: tl.constexpr, AS_BITS: tl.constexpr,
):  # fmt: skip
    b, hk = tl.program_id(0), tl.program_id(1)
    slot = tl.load(slot_ptr + b).to(tl.int64)
    start = tl.load(start_ptr + b).to(tl.int32)
    rows = tl.arange(0, BM)
    t, head = rows // REP, hk * REP + rows % REP
    mrow = t < T
    d = tl.arange(0, BD)
    md = d < D
    q = tl.load(q_ptr + b * sq_b + head[:, None] * sq_h + t[:, None] * sq_t + d[None, :],
                mask=mrow[:, None] & md[None, :], other=0)  # fmt: skip
    q = widen(q, True) if AS_BITS else q
    if CAUSAL:
        limit = start + t
    else:
        limit = start + T - 1 + t * 0
    kv_end = tl.minimum(attn_len, start + T)
    k_base = k_ptr + slot * sk_s + hk * sk_h
    v_base = v_ptr + slot * sv_s + hk * sv_h
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BD], tl.float32)
    for n0 in range(0, kv_end, BN):
        j = n0 + tl.arange(0, BN)
        mj = j < kv_end
        k = tl.load(k_base + j[:, None].to(tl.int64) * sk_l + d[None, :], mask=mj[:, None] & md[None, :], other=0)
        k = widen(k, True) if AS_BITS else k
        s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=PREC) * scale
        s = tl.where((j[None, :] <= limit[:, None]) & mj[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + j[:, None].to(tl.int64) * sv_l + d[None, :], mask=mj[:, None] & md[None, :], other=0)
        v = widen(v, True) if AS_BITS else v
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=PREC)
        m_i = m_new
    out = acc / l_i[:, None]
    o_ptrs = o_ptr + ((b * T + t[:, None]).to(tl.int64) * H + head[:, None]) * D + d[None, :]
    if AS_BITS:
        tl.store(o_ptrs, bf16_bits(out), mask=mrow[:, None] & md[None, :])
    else:
        tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=mrow[:, None] & md[None, :])


def supports(q: Tensor, k_cache: Tensor) -> bool:
    """Shapes the kernel takes: at most MAX_T new tokens, GQA heads dividing, feature dims contiguous."""
    B, H, T, D = q.shape
    return (T <= MAX_T and H % k_cache.shape[1] == 0 and k_cache.shape[-1] == D and q.stride(-1) == 1
            and k_cache.stride(-1) == 1)


def decode_attention_triton(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, start: Tensor,
                            attn_len: int, scale: float, causal_block: bool = True) -> Tensor:
    """``decode_attention_reference`` in one launch; returns [B, H, T, D] (a view of a [B, T, H, D] tensor,
    the layout the output projection reads)."""
    B, H, T, D = q.shape
    if not supports(q, k_cache) or v_cache.shape != k_cache.shape or v_cache.stride(-1) != 1:
        raise OcriaError(f"decode_attention kernel: q {tuple(q.shape)}, cache {tuple(k_cache.shape)}: needs "
                         f"T <= {MAX_T}, heads divisible by KV heads, equal K/V caches, contiguous feature dims")
    rep = H // k_cache.shape[1]
    out = torch.empty(B, T, H, D, dtype=q.dtype, device=q.device)
    if B == 0 or T == 0:
        return out.transpose(1, 2)
    BM = max(16, triton.next_power_of_2(MAX_T * rep))
    # The interpreter has no bf16 arithmetic: there bf16 travels as int16 bits and is computed in fp32.
    as_bits = q.dtype == torch.bfloat16 and q.device.type == "cpu"
    q_, k_, v_, out_ = (bf16_as_int16(t) if as_bits else t for t in (q, k_cache, v_cache, out))
    _decode_attention_kernel[(B, k_cache.shape[1])](
        q_, k_, v_, slots.contiguous(), start.contiguous(), out_,
        q.stride(0), q.stride(1), q.stride(2), *k_cache.stride()[:3], *v_cache.stride()[:3],
        T, H, min(attn_len, k_cache.shape[2]), scale,
        REP=rep, D=D, BD=max(16, triton.next_power_of_2(D)), BM=BM, BN=32, CAUSAL=causal_block,
        PREC="ieee" if q.dtype == torch.float32 or as_bits else "tf32", AS_BITS=as_bits,
        num_warps=8 if BM * D >= 64 * 128 else 4,
    )  # fmt: skip
    return out.transpose(1, 2)
