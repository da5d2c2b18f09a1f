"""Triton kernels, split-KV ("flash-decoding") form. Phase one runs one program per (batch row, KV
head, context chunk): all the head's query heads and new tokens (``T * H / Hkv`` query rows) over
the chunk's keys with an online softmax, reading the slot's KV in place (no gather, head repeat or
mask tensor). With one chunk it writes the output directly; with several it writes each chunk's
(max, sum, unnormalised output) and a combine kernel merges them by the log-sum-exp rule.

Why split: at batch 1 the model has 2 KV heads, so one program per (row, head) is 2 programs on a
132-SM GPU walking the whole context serially. The chunk count is chosen on the host from the
attention length and ``B * Hkv`` (one wave of programs), and is 1 (no combine launch) once
``B * Hkv`` fills the GPU by itself.

Chunks start at multiples of the chunk length and the key loop at multiples of BN, and the
query-row tile is the same for every T up to 16, so for a given chunk count (a function of
``attn_len`` and ``B * Hkv``, never of T) a token decoded alone (``ar``) and inside a verify block
runs the same arithmetic. In a batch-invariant step (``Launch.INVARIANT``: the policy's ``for_steps``) the
chunks are ``INVARIANT_CHUNK`` keys whatever the length or batch, and always combined: a query's
result then depends on its own context only, not on the block or batch it came in.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from ocria.errors import OcriaError
from ocria.plugins.launch import pdl_args, pdl_enter, sm_count
from ocria.plugins.policy import DEFAULT_LAUNCH, Launch
from ocria.plugins.rounding import bf16_as_int16, bf16_bits, widen

MAX_T = 16  # decode and verify blocks; longer (prefill) chunks take the reference
BN = 32  # keys per loop step
MIN_CHUNK = BN  # keys per chunk at least: one loop step (at small batch a program's time is its loop's latency)
MAX_SPLITS = 64  # chunks per context at most, outside batch-invariant steps
COMBINE_GROUP = 16  # partials the combine kernel reduces at once
INVARIANT_CHUNK = MIN_CHUNK  # keys per chunk in a batch-invariant step, whatever the batch or the length
# Token counts, lengths and chunking are runtime values: one compiled kernel per head shape, not per
# attention-length bucket or T.
RUNTIME_INTS = ["T", "attn_len", "chunk", "n_split"]


@triton.jit(do_not_specialize=RUNTIME_INTS)
def _decode_attention_kernel(
    q_ptr, k_ptr, v_ptr, slot_ptr, start_ptr, o_ptr, m_ptr, l_ptr,  # o_ptr: the output, or the chunks' acc
    sq_b, sq_h, sq_t, sk_s, sk_h, sk_l, sv_s, sv_h, sv_l,
    T, H, attn_len, scale, chunk, n_split,
    REP: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
    CAUSAL: tl.constexpr, SPLIT: tl.constexpr, PREC: tl.constexpr, AS_BITS: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_enter(PDL)
    b, hk, sp = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(slot_ptr + b).to(tl.int64)
    start = tl.load(start_ptr + b).to(tl.int32)
    kv_end = tl.minimum(attn_len, start + T)
    lo = sp * chunk
    hi = tl.minimum(kv_end, lo + chunk)
    rows = tl.arange(0, BM)
    t, head = rows // REP, hk * REP + rows % REP
    mrow = (t < T) & (lo + t * 0 < hi)  # a chunk past the row's context loads and writes nothing
    d = tl.arange(0, BD)
    md = d < D
    q = tl.load(q_ptr + b * sq_b + head[:, None] * sq_h + t[:, None] * sq_t + d[None, :],
                mask=mrow[:, None] & md[None, :], other=0)  # fmt: skip
    q = widen(q, True) if AS_BITS else q
    if CAUSAL:
        limit = start + t
    else:
        limit = start + T - 1 + t * 0
    k_base = k_ptr + slot * sk_s + hk * sk_h
    v_base = v_ptr + slot * sv_s + hk * sv_h
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BD], tl.float32)
    for n0 in range(lo, hi, BN):
        j = n0 + tl.arange(0, BN)
        mj = j < hi
        k = tl.load(k_base + j[:, None].to(tl.int64) * sk_l + d[None, :], mask=mj[:, None] & md[None, :], other=0)
        k = widen(k, True) if AS_BITS else k
        s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=PREC) * scale
        s = tl.where((j[None, :] <= limit[:, None]) & mj[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A chunk may hold no key a query row sees (causal rows before the chunk): keep exp() finite.
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_use)
        p = tl.exp(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + j[:, None].to(tl.int64) * sv_l + d[None, :], mask=mj[:, None] & md[None, :], other=0)
        v = widen(v, True) if AS_BITS else v
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=PREC)
        m_i = m_new
    row = (b * T + t).to(tl.int64) * H + head  # [B, T, H] order, the output's
    if SPLIT:
        part = row * n_split + sp
        tl.store(m_ptr + part, m_i, mask=mrow)
        tl.store(l_ptr + part, l_i, mask=mrow)
        tl.store(o_ptr + part[:, None] * D + d[None, :], acc, mask=mrow[:, None] & md[None, :])
    else:
        out = acc / l_i[:, None]
        o_ptrs = o_ptr + row[:, None] * D + d[None, :]
        if AS_BITS:
            tl.store(o_ptrs, bf16_bits(out), mask=mrow[:, None] & md[None, :])
        else:
            tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=mrow[:, None] & md[None, :])


@triton.jit(do_not_specialize=RUNTIME_INTS)
def _combine_kernel(
    m_ptr, l_ptr, acc_ptr, start_ptr, o_ptr, T, H, attn_len, chunk, n_split,
    D: tl.constexpr, BD: tl.constexpr, G: tl.constexpr, AS_BITS: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """One program per (row, new token) x query head: out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s.

    The chunks go in groups of G: each group's weighted sum is one reduction of a fixed [G, D] shape and the
    groups add up in order. A chunk past a query row's context holds m = -inf, l = 0, acc = 0 (exact zeros once
    weighted), as does a masked lane, so the row's result does not depend on how many chunks the launch has."""
    pdl_enter(PDL)
    bt, head = tl.program_id(0), tl.program_id(1)
    start = tl.load(start_ptr + bt // T).to(tl.int32)
    used = tl.cdiv(tl.minimum(attn_len, start + T), chunk)  # chunks phase one wrote for this row
    base = (bt.to(tl.int64) * H + head) * n_split
    s = tl.arange(0, G)
    m_max = tl.full([G], float("-inf"), tl.float32)
    for g0 in range(0, used, G):
        m_max = tl.maximum(m_max, tl.load(m_ptr + base + g0 + s, mask=g0 + s < used, other=float("-inf")))
    m_all = tl.max(m_max, 0)  # chunk 0 holds key 0, which every query sees: the max is finite
    d = tl.arange(0, BD)
    md = d < D
    l_sum = 0.0
    acc = tl.zeros([BD], tl.float32)
    for g0 in range(0, used, G):
        ms = g0 + s < used
        w = tl.exp(tl.load(m_ptr + base + g0 + s, mask=ms, other=float("-inf")) - m_all)
        l_sum += tl.sum(tl.load(l_ptr + base + g0 + s, mask=ms, other=0) * w, 0)
        part = tl.load(acc_ptr + (base + g0 + s)[:, None] * D + d[None, :], mask=ms[:, None] & md[None, :], other=0)
        acc += tl.sum(part * w[:, None], 0)
    out = acc / l_sum
    o_ptrs = o_ptr + (bt.to(tl.int64) * H + head) * D + d
    if AS_BITS:
        tl.store(o_ptrs, bf16_bits(out), mask=md)
    else:
        tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=md)


def supports(q: Tensor, k_cache: Tensor) -> bool:
    """Shapes the kernel takes: at most MAX_T new tokens, GQA heads dividing, feature dims contiguous."""
    B, H, T, D = q.shape
    return (T <= MAX_T and H % k_cache.shape[1] == 0 and k_cache.shape[-1] == D and q.stride(-1) == 1
            and k_cache.stride(-1) == 1)


def split_count(programs: int, attn_len: int, sms: int) -> int:
    """Chunks per (row, KV head): as many as keep ``programs`` x chunks within one wave of ``sms``, none
    shorter than MIN_CHUNK keys; 1 (no combine launch) once the programs alone fill half the GPU."""
    return max(1, min(sms // programs, triton.cdiv(attn_len, MIN_CHUNK), MAX_SPLITS))


def chunking(attn_len: int, num_splits: int) -> tuple[int, int]:
    """(keys per chunk, chunks) for about ``num_splits`` chunks: chunks start on BN multiples and none
    lies wholly past ``attn_len``."""
    chunk = triton.cdiv(triton.cdiv(attn_len, max(1, num_splits)), BN) * BN
    return chunk, triton.cdiv(attn_len, chunk)


def decode_attention_triton(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, start: Tensor,
                            attn_len: int, scale: float, causal_block: bool = True,
                            num_splits: int | None = None, launch: Launch = DEFAULT_LAUNCH) -> Tensor:
    """``decode_attention_reference`` in one launch, or two (chunks + combine) when the context is split
    in ``num_splits`` chunks (None: ``split_count`` for this device); returns [B, H, T, D] (a view of a
    [B, T, H, D] tensor, the layout the output projection reads)."""
    B, H, T, D = q.shape
    if not supports(q, k_cache) or v_cache.shape != k_cache.shape or v_cache.stride(-1) != 1:
        raise OcriaError(f"decode_attention kernel: q {tuple(q.shape)}, cache {tuple(k_cache.shape)}: needs "
                         f"T <= {MAX_T}, heads divisible by KV heads, equal K/V caches, contiguous feature dims")
    Hkv = k_cache.shape[1]
    rep = H // Hkv
    attn_len = min(attn_len, k_cache.shape[2])
    if attn_len < 1:
        raise OcriaError(f"decode_attention kernel: attn_len {attn_len}: the queries need at least one key")
    out = torch.empty(B, T, H, D, dtype=q.dtype, device=q.device)
    if B == 0 or T == 0:
        return out.transpose(1, 2)
    invariant = num_splits is None and Launch.INVARIANT in launch
    if invariant:  # chunking independent of the batch and the length, and always combined the same way
        chunk, n_split = INVARIANT_CHUNK, triton.cdiv(attn_len, INVARIANT_CHUNK)
    else:
        if num_splits is None:
            num_splits = split_count(B * Hkv, attn_len, sm_count(q.device))
        chunk, n_split = chunking(attn_len, num_splits)
    split = n_split > 1 or invariant
    BM = max(16, triton.next_power_of_2(MAX_T * rep))
    BD = max(16, triton.next_power_of_2(D))
    # The interpreter has no bf16 arithmetic: there bf16 travels as int16 bits and is computed in fp32.
    as_bits = q.dtype == torch.bfloat16 and q.device.type == "cpu"
    q_, k_, v_, out_ = (bf16_as_int16(t) if as_bits else t for t in (q, k_cache, v_cache, out))
    slots, start = slots.contiguous(), start.contiguous()
    if split:  # one workspace: each chunk's acc [D], max and sum per query row
        parts = B * T * H * n_split
        ws = torch.empty(parts * (D + 2), dtype=torch.float32, device=q.device)
        acc, m, lsum = ws.split([parts * D, parts, parts])
    else:
        m = lsum = acc = out_  # not read: the one-chunk kernel writes the output itself
    _decode_attention_kernel[(B, Hkv, n_split)](
        q_, k_, v_, slots, start, acc, m, lsum,
        q.stride(0), q.stride(1), q.stride(2), *k_cache.stride()[:3], *v_cache.stride()[:3],
        T, H, attn_len, scale, chunk, n_split,
        REP=rep, D=D, BD=BD, BM=BM, BN=BN, CAUSAL=causal_block, SPLIT=split,
        PREC="ieee" if q.dtype == torch.float32 or as_bits else "tf32", AS_BITS=as_bits,
        num_warps=8 if BM * D >= 64 * 128 else 4, **pdl_args(q.device, launch),
    )  # fmt: skip
    if split:
        _combine_kernel[(B * T, H)](
            m, lsum, acc, start, out_, T, H, attn_len, chunk, n_split,
            D=D, BD=BD, G=COMBINE_GROUP, AS_BITS=as_bits, num_warps=4, **pdl_args(q.device, launch),
        )  # fmt: skip
    return out.transpose(1, 2)
