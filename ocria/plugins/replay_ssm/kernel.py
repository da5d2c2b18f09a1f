"""Triton kernels for ReplaySSM: replay verification of Gated DeltaNet and the conv window rollback.

``replay_verify``: one program per (value-column tile, value head, batch row). It reads its
``[BV, Dk]`` slice of the checkpoint state (held transposed) once, folds the slot's pending tokens
into it, writes it back once, then computes the T outputs from it as one chunk without forming
per-token states. The chunk uses the WY form of the delta rule, so the work is a few matrix products
with the state as the 64+-row operand (Hopper wgmma) plus a T x T triangular inverse, instead of T
dependent rank-1 updates:

    G_t = cumsum(g);  A_ij = beta_i exp(G_i - G_j) k_i.k_j  (j < i)
    (I + A) U = diag(beta) (V - diag(exp G) K S0)
    S_T = exp(G_T) S0 + (K * exp(G_T - G))^T U
    O   = diag(exp G) Q S0 + (mask_{j<=i} exp(G_i - G_j) Q K^T) U

The rows of U are the tokens' writes u, and row t only depends on tokens <= t, so the U of a step's
first n tokens is what the next step needs to fold those n tokens if they are accepted: the ring parks
U (not V and beta), and the fold is the single product ``S_T`` above, with no Gram matrix, inverse or
state read feeding back.

The state-independent T x T part (L2-norms, gates, Gram matrices, the inverse, the decayed scores) runs
first, in ``_chunk_prep_kernel``, once per batch row and value head (key head on deep grids, its Gram and score
matrices shared by its value heads): inside the state-tile programs it was repeated per column tile and sat on
their critical path. The inverse is the series (I - A)(I + A^2)(I + A^4)... of tensor-core products, not a
row-by-row substitution.

``_verify_block_kernel`` (T > 1) streams its state tile in key chunks: the fold and both state products
(S K^T, S Q^T) are sums over the key axis, so each [BV, KEY_CHUNK] chunk is read, folded, written back and
multiplied with the same chunk of the new tokens' raw keys and queries (their L2-norms summed alongside and
applied after the loop). A program then holds one chunk, not the tile (96-108 against ~220 registers), and the
pipeliner keeps the next chunks' loads in flight. Nothing before the loop's end reads the prep kernel's output,
so on Hopper the block kernel is launched with PDL beside it and waits for it only after the loop.

On sm_90 with bf16 inputs and Qwen3.5's GDN heads (``warp_specialized``), a default T > 1 launch takes the
warp-specialized Gluon kernel of ``hopper.py`` instead: prep, state streaming and the chunk math in one launch, in
partitions that overlap; the prep and block kernels stay the path for every other GPU, dtype and shape, and for
key or query rows Triton cannot prove 16-byte aligned (its cp.async copies need that).

``_verify_one_kernel`` (T = 1, plain decoding) keeps the whole tile: at most one pending token (a runtime
branch on the slot's count) is folded as a plain rank-1 write, the new token is verified with two row
reductions of the state, and a slot with nothing pending skips the state write. ``launch_config`` narrows the
column tile for small batches so the grid still covers the SMs, and caps registers when the grid is deep.

In a batch-invariant step (``Launch.INVARIANT``: the policy's ``for_steps``) ``_replay_sequential_kernel`` runs instead:
pending tokens folded and new tokens verified one at a time, with the one-token code above, in one binary for
every T and one tile shape for every batch. Slower for long blocks (T dependent steps), but a token's output is
then the same bits whether it was verified in a block or decoded alone, which the WY chunk does not give.

Reads come from ring half ``phase`` and writes go to half ``1 - phase``, so no program of a launch
writes what another one reads; each shared k/g entry has one writer (T = 1: the tile-0 program; T > 1:
the prep kernel, whose output the block kernel reads only after waiting for it, or ``hopper.py``'s prep partition).
"""

import math
from functools import lru_cache

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.runtime.interpreter import InterpretedFunction

from ocria.errors import OcriaError
from ocria.plugins.launch import pdl_args, pdl_capable, pdl_enter
from ocria.plugins.policy import DEFAULT_LAUNCH, Launch
from ocria.plugins.replay_ssm import hopper

# Tensor-core precision of the kernel's matrix products, by input dtype. tf32x3 (three tf32
# products) keeps fp32 accuracy; one tf32 product costs ~1e-3 relative on the folded state (checked on the
# H200 against float64), under bf16's own rounding, at a third of the registers.
DOT_PRECISION = {torch.float32: "tf32x3", torch.bfloat16: "tf32", torch.float16: "tf32"}
# At T = 1 the new token's loads can go out before the fold, off the critical path, but its values are
# then held across the fold: free in registers for 16-column tiles, 170 -> 208 registers (one program
# fewer per SM) for 32 columns and more spills for 64 (Triton 3.9 + ptxas, sm_90a; a guide for the H200's
# 3.6). Narrow tiles are the small-batch launch, where latency and not occupancy sets the time.
PREFETCH_MAX_BLOCK_V = 16
# The prep kernel's work is [T, T] matrices: with few warps its reductions stay inside a warp (shuffles, no
# shared-memory round trips), which is what its latency is made of.
PREP_WARPS = 2
# Batch-invariant steps (``_replay_sequential_kernel``): one tile for every batch size and T. One warp keeps each
# token's reductions in shuffles, no shared memory or barrier: 16 columns x 1 warp took 10.7 / 29.7 / 105 us at
# batch 1 / 8 / 32 x 16 tokens, against 23.4 / 92.7 / 349 with 4 warps and 18-20 / 49-60 / 152-232 with 2 warps or
# 32 columns, and beat the one-token kernel at T = 1 (2.5 / 6.0 / 22.0 us against 3.3 / 8.4 / 31.1; H200).
INVARIANT_BLOCK_V = 16
INVARIANT_WARPS = 1
# T > 1 on Hopper: the block kernel is launched with PDL beside _chunk_prep_kernel, which lets it start at once; its
# programs stream and fold their state while the prep runs and wait for the prep only before they read its output.
OVERLAP_PREP = True


@triton.jit
def _softplus(x):
    return tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))


@triton.jit
def _head_gate_params(A_log_ptr, dt_bias_ptr, i_h):
    """(A_log, dt_bias) of value head i_h as fp32 scalars."""
    return tl.load(A_log_ptr + i_h).to(tl.float32), tl.load(dt_bias_ptr + i_h).to(tl.float32)


@triton.jit
def _log_decay(a, A_log, dt_bias):
    """g = -exp(A_log) softplus(a + dt_bias) (a in fp32; A_log, dt_bias the head's, from ``_head_gate_params``)."""
    return -tl.exp(A_log) * _softplus(a + dt_bias)


@triton.jit
def _tril_inverse(kk, gc, beta, TP: tl.constexpr, PREC: tl.constexpr):
    """(I + A)^-1 with A_ij = beta_i exp(G_i - G_j) kk_ij (j < i).

    A is strictly lower triangular, so A^TP = 0 and the inverse is the finite series sum_k (-A)^k,
    taken as the product (I - A)(I + A^2)(I + A^4)...: 2 log2(TP) - 2 [TP, TP] products at the chunk's
    dot precision (tf32x3 for fp32 inputs) and no serial loop over rows.
    """
    ri = tl.arange(0, TP)
    lower = ri[:, None] > ri[None, :]
    B = tl.where(lower, -beta[:, None] * tl.exp(tl.where(lower, gc[:, None] - gc[None, :], 0.0)) * kk, 0.0)
    inv = tl.where(ri[:, None] == ri[None, :], 1.0, 0.0) + B
    for i in tl.static_range(1, TP):
        if (1 << i) < TP:
            B = tl.dot(B, B, input_precision=PREC)  # (-A)^(2^i)
            inv += tl.dot(inv, B, input_precision=PREC)
    return inv


@triton.jit
def _slot_position(slot_ptr, ring_phase_ptr, pending_ptr, i_b):
    """Batch row i_b's state slot (int64), the ring half that holds its pending tokens, and their count."""
    slot = tl.load(slot_ptr + i_b).to(tl.int64)
    return slot, tl.load(ring_phase_ptr + slot).to(tl.int64), tl.load(pending_ptr + slot)


@triton.jit
def _pending_writes(ring_u_ptr, ring_g_ptr, tok, n, i_h, rt, rv, mv, HV: tl.constexpr, DV: tl.constexpr):
    """What folding the n pending tokens at ring rows ``tok`` needs besides their keys: the total log-decay and their
    writes U^T [BV, TP] (parked by the step that verified them, from this very state, so the fold is one rank-n
    product with no Gram matrix or inverse), column t weighted by its key's decay to the end, exp(g_tot - G_t): once
    per tile here, not on every key chunk."""
    mp = rt < n
    gp = tl.load(ring_g_ptr + tok * HV + i_h, mask=mp, other=0.0)
    g_tot = tl.sum(gp, 0)
    UpT = tl.load(ring_u_ptr + (tok[None, :] * HV + i_h) * DV + rv[:, None], mask=mv[:, None] & mp[None, :], other=0.0)
    return g_tot, UpT * tl.exp(g_tot - tl.cumsum(gp, 0))[None, :]


@triton.jit
def _fold(St, UwT, g_tot, ring_k_ptr, tok, n, rt, hk, rk, mk, HK: tl.constexpr, DK: tl.constexpr,
          PREC: tl.constexpr):  # fmt: skip
    """exp(g_tot) St + (U^T w) K: the n pending tokens (ring rows ``tok``, from ``_pending_writes``) applied to the
    state tile St [BV, len(rk)], or to a key chunk of it (key columns ``rk``)."""
    Kp = tl.load(ring_k_ptr + (tok[:, None] * HK + hk) * DK + rk[None, :], mask=(rt < n)[:, None] & mk[None, :],
                 other=0.0)  # fmt: skip
    return tl.dot(UwT, Kp, St * tl.exp(g_tot), input_precision=PREC)


@triton.jit
def _state_written(rv, n, DV: tl.constexpr):
    """[BV, 1] mask of a state tile's store: all rows when something was folded, none when nothing was pending
    (the state is then unchanged and not rewritten). A bound, not ``n > 0``: the interpreter cannot AND a block
    with a scalar bool."""
    return (rv < tl.minimum(n, 1) * DV)[:, None]


@triton.jit
def _fold_one(St, ring_k_ptr, ring_u_ptr, ring_g_ptr, tok0, n, i_h, hk, rk, rv,
              HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr):  # fmt: skip
    """St with at most one pending token (ring row ``tok0``) applied as a rank-1 write.

    n = 0 loads g = 0 and u = 0, so St comes back unchanged bit for bit (exp(0) = 1).
    """
    live = tl.minimum(n, 1)  # masks as index bounds: the interpreter cannot AND a block with a scalar bool
    g = tl.load(ring_g_ptr + tok0 * HV + i_h, mask=live > 0, other=0.0)
    kp = tl.load(ring_k_ptr + (tok0 * HK + hk) * DK + rk, mask=rk < live * DK, other=0.0)
    up = tl.load(ring_u_ptr + (tok0 * HV + i_h) * DV + rv, mask=rv < live * DV, other=0.0)
    return St * tl.exp(g) + up[:, None] * kp[None, :]


@triton.jit
def _load_one_token(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, i_b, i_h, hk, sq, sk, sv, sa, sb, rk, rv, mk, mv,
                    DK: tl.constexpr, DV: tl.constexpr):  # fmt: skip
    """k, q [BK], this tile's v [BV] and a, b of batch row i_b's single new token, as fp32."""
    row = i_b.to(tl.int64)
    k = tl.load(k_ptr + row * sk + hk * DK + rk, mask=mk, other=0.0).to(tl.float32)
    q = tl.load(q_ptr + row * sq + hk * DK + rk, mask=mk, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + row * sv + i_h * DV + rv, mask=mv, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + row * sa + i_h).to(tl.float32)
    b = tl.load(b_ptr + row * sb + i_h).to(tl.float32)
    return k, q, v, a, b


@triton.jit
def _token_step(St, k1, q1, v1, a1, b1, A_log, dt_bias, scale, eps):
    """One token's delta step on the state tile St [BV, BK] it sees (pending tokens folded): two row reductions
    of the state, no Gram matrix or inverse. Returns (normalised key [BK], log-decay g, write u [BV], output o
    [BV]); the state after the token is ``_write_one(St, exp(g), u, key)``. A_log, dt_bias: the head's, fp32."""
    Kn = k1 * tl.rsqrt(tl.sum(k1 * k1, 0) + eps)
    Q = q1 * (tl.rsqrt(tl.sum(q1 * q1, 0) + eps) * scale)
    g = _log_decay(a1, A_log, dt_bias)
    beta = tl.sigmoid(b1)
    decay = tl.exp(g)
    u = beta * (v1 - decay * tl.sum(St * Kn[None, :], 1))
    o = decay * tl.sum(St * Q[None, :], 1) + u * tl.sum(Kn * Q, 0)
    return Kn, g, u, o


@triton.jit
def _write_one(St, decay, u, kn):
    """``decay * St + u kn^T`` with its rounding spelled out (one product, then one fused multiply-add per
    element), so a token written inside a verify block and one folded from the ring at the next step give the
    same bits."""
    return tl.fma(u[:, None], kn[None, :], St * decay)


@triton.jit(do_not_specialize=["T"])  # one binary for every block length: a one-token step runs this same code
def _replay_sequential_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr,
    state_ptr, ring_k_ptr, ring_u_ptr, ring_g_ptr, ring_phase_ptr, pending_ptr, slot_ptr,
    o_ptr, T, Tmax, scale, eps, sq, sk, sv, sa, sb,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """The batch-invariant ``replay_verify``: the pending tokens folded one by one, then the T new tokens one
    after another, each with ``_token_step`` on the state the tokens before it left, written with
    ``_write_one`` as the fold of the next step writes it. Token t's output is then the one it gets when
    decoded alone (T = 1 after the same accepted tokens), whatever T, batch or tile neighbours."""
    pdl_enter(PDL)
    i_v, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    hk = i_h // (HV // HK)
    rk = tl.arange(0, BK)
    rv = i_v * BV + tl.arange(0, BV)
    mk, mv = rk < DK, rv < DV
    slot, phase, n = _slot_position(slot_ptr, ring_phase_ptr, pending_ptr, i_b)
    s_ptrs = state_ptr + ((slot * HV + i_h) * DK + rk[None, :]) * DV + rv[:, None]
    St = tl.load(s_ptrs, mask=mv[:, None] & mk[None, :], other=0.0)
    tok = (slot * 2 + phase) * Tmax
    for i in range(n):
        g = tl.load(ring_g_ptr + (tok + i) * HV + i_h)
        kp = tl.load(ring_k_ptr + ((tok + i) * HK + hk) * DK + rk, mask=mk, other=0.0)
        up = tl.load(ring_u_ptr + ((tok + i) * HV + i_h) * DV + rv, mask=mv, other=0.0)
        St = _write_one(St, tl.exp(g), up, kp)
    tl.store(s_ptrs, St, mask=_state_written(rv, n, DV) & mk[None, :])
    park = (slot * 2 + 1 - phase) * Tmax
    A_log, dt_bias = _head_gate_params(A_log_ptr, dt_bias_ptr, i_h)
    nxt = _load_one_token(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, i_b * T, i_h, hk, sq, sk, sv, sa, sb, rk, rv, mk, mv,
                          DK, DV)  # fmt: skip
    for t in range(T):
        k1, q1, v1, a1, b1 = nxt
        # The next token's loads go out now, under this token's reductions (the last token loads itself again).
        nxt = _load_one_token(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, i_b * T + tl.minimum(t + 1, T - 1), i_h, hk, sq, sk,
                              sv, sa, sb, rk, rv, mk, mv, DK, DV)  # fmt: skip
        Kn, g, u, o = _token_step(St, k1, q1, v1, a1, b1, A_log, dt_bias, scale, eps)
        tl.store(o_ptr + ((i_b * T + t) * HV + i_h).to(tl.int64) * DV + rv, o.to(o_ptr.dtype.element_ty), mask=mv)
        tl.store(ring_u_ptr + ((park + t) * HV + i_h) * DV + rv, u, mask=mv)
        if i_v == 0:
            tl.store(ring_g_ptr + (park + t) * HV + i_h, g)
            if i_h % (HV // HK) == 0:
                tl.store(ring_k_ptr + ((park + t) * HK + hk) * DK + rk, Kn, mask=mk)
        St = _write_one(St, tl.exp(g), u, Kn)


@triton.jit
def _verify_one_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr,
    state_ptr, ring_k_ptr, ring_u_ptr, ring_g_ptr, ring_phase_ptr, pending_ptr, slot_ptr,
    o_ptr, Tmax, scale, eps, sq, sk, sv, sa, sb,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, TP: tl.constexpr, PREC: tl.constexpr, PREFETCH: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    """T = 1 (plain decoding) on one [BV, Dk] state tile: the pending tokens folded (one product, or a rank-1 write
    for at most one), the tile written back once, then the new token's delta step as two row reductions of it."""
    pdl_enter(PDL)
    i_v, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    hk = i_h // (HV // HK)
    rt = tl.arange(0, TP)
    rk = tl.arange(0, BK)
    rv = i_v * BV + tl.arange(0, BV)
    mk, mv = rk < DK, rv < DV
    ms = mv[:, None] & mk[None, :]
    if PREFETCH:  # the new token's inputs do not depend on the slot: their loads go out first
        k1, q1, v1, a1, b1 = _load_one_token(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, i_b, i_h, hk, sq, sk, sv, sa, sb,
                                             rk, rv, mk, mv, DK, DV)  # fmt: skip

    slot, phase, n = _slot_position(slot_ptr, ring_phase_ptr, pending_ptr, i_b)
    s_ptrs = state_ptr + ((slot * HV + i_h) * DK + rk[None, :]) * DV + rv[:, None]
    St = tl.load(s_ptrs, mask=ms, other=0.0)
    tok = (slot * 2 + phase) * Tmax
    if n > 1:
        g_tot, UwT = _pending_writes(ring_u_ptr, ring_g_ptr, tok + rt, n, i_h, rt, rv, mv, HV, DV)
        St = _fold(St, UwT, g_tot, ring_k_ptr, tok + rt, n, rt, hk, rk, mk, HK, DK, PREC)
    else:
        St = _fold_one(St, ring_k_ptr, ring_u_ptr, ring_g_ptr, tok, n, i_h, hk, rk, rv, HK, HV, DK, DV)
    tl.store(s_ptrs, St, mask=_state_written(rv, n, DV) & mk[None, :])

    if not PREFETCH:
        k1, q1, v1, a1, b1 = _load_one_token(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, i_b, i_h, hk, sq, sk, sv, sa, sb,
                                             rk, rv, mk, mv, DK, DV)  # fmt: skip
    A_log, dt_bias = _head_gate_params(A_log_ptr, dt_bias_ptr, i_h)
    Kn, g, u, o = _token_step(St, k1, q1, v1, a1, b1, A_log, dt_bias, scale, eps)
    park = (slot * 2 + 1 - phase) * Tmax
    tl.store(o_ptr + (i_b * HV + i_h).to(tl.int64) * DV + rv, o.to(o_ptr.dtype.element_ty), mask=mv)
    tl.store(ring_u_ptr + (park * HV + i_h) * DV + rv, u, mask=mv)
    if i_v == 0:
        tl.store(ring_g_ptr + park * HV + i_h, g)
        if i_h % (HV // HK) == 0:
            tl.store(ring_k_ptr + (park * HK + hk) * DK + rk, Kn, mask=mk)


@triton.jit
def _chunk_prep_kernel(
    q_ptr, k_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, ring_k_ptr, ring_g_ptr, ring_phase_ptr, slot_ptr,
    mats_ptr, T, Tmax, scale, eps, sq, sk, sa, sb,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, BK: tl.constexpr, TP: tl.constexpr,
    HEADS: tl.constexpr, PREC: tl.constexpr, PDL: tl.constexpr, OVERLAP: tl.constexpr,
):  # fmt: skip
    """The state-independent T x T work of a verify block, once per batch row and group of ``HEADS`` value heads
    (of one key head): L2-norms and the Gram and score matrices of the key head, then for each value head the
    gates, the triangular inverse and the decayed scores. Parks the log-decays and (first group of a key head) the
    normalised keys in the ring (park half), and writes per value head ``mats`` [B, Hv, 2, TP, TP]: (I + A)^-1
    with column j scaled by beta_j, and the causal decayed scores P_ij = exp(G_i - G_j) q_i.k_j (j <= i). With
    OVERLAP the block kernel after it may start at once: it streams and folds its state first."""
    pdl_enter(PDL, OVERLAP)
    i_g, i_b = tl.program_id(0), tl.program_id(1)
    hk = i_g * HEADS // (HV // HK)
    rt = tl.arange(0, TP)
    rk = tl.arange(0, BK)
    mt = rt < T
    mtk = mt[:, None] & (rk < DK)[None, :]
    row = (i_b * T + rt).to(tl.int64)
    Kn = tl.load(k_ptr + row[:, None] * sk + hk * DK + rk[None, :], mask=mtk, other=0.0).to(tl.float32)
    Kn = Kn * tl.rsqrt(tl.sum(Kn * Kn, 1) + eps)[:, None]
    Q = tl.load(q_ptr + row[:, None] * sq + hk * DK + rk[None, :], mask=mtk, other=0.0).to(tl.float32)
    Q = Q * (tl.rsqrt(tl.sum(Q * Q, 1) + eps) * scale)[:, None]
    kk = tl.dot(Kn, tl.trans(Kn), input_precision=PREC)
    qk = tl.dot(Q, tl.trans(Kn), input_precision=PREC)
    slot = tl.load(slot_ptr + i_b).to(tl.int64)
    park = (slot * 2 + 1 - tl.load(ring_phase_ptr + slot).to(tl.int64)) * Tmax + rt
    if (i_g * HEADS) % (HV // HK) == 0:
        tl.store(ring_k_ptr + (park[:, None] * HK + hk) * DK + rk[None, :], Kn, mask=mtk)
    causal = rt[:, None] >= rt[None, :]
    mat = rt[:, None] * TP + rt[None, :]
    for j in tl.static_range(HEADS):
        i_h = i_g * HEADS + j
        a = tl.load(a_ptr + row * sa + i_h, mask=mt, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + row * sb + i_h, mask=mt, other=0.0).to(tl.float32)
        A_log, dt_bias = _head_gate_params(A_log_ptr, dt_bias_ptr, i_h)
        g = tl.where(mt, _log_decay(a, A_log, dt_bias), 0.0)
        beta = tl.where(mt, tl.sigmoid(b), 0.0)
        gc = tl.cumsum(g, 0)
        inv = _tril_inverse(kk, gc, beta, TP, PREC)
        P = tl.where(causal, qk * tl.exp(tl.where(causal, gc[:, None] - gc[None, :], 0.0)), 0.0)
        tl.store(ring_g_ptr + park * HV + i_h, g, mask=mt)
        base = mats_ptr + (i_b * HV + i_h).to(tl.int64) * 2 * TP * TP
        tl.store(base + mat, inv * beta[None, :])
        tl.store(base + TP * TP + mat, P)


@triton.jit
def _verify_block_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr,
    state_ptr, ring_k_ptr, ring_u_ptr, ring_g_ptr, ring_phase_ptr, pending_ptr, slot_ptr,
    o_ptr, mats_ptr, T, Tmax, scale, eps, sq, sk, sv, sa, sb,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    TP: tl.constexpr, PREC: tl.constexpr, BKC: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr,
    OVERLAP: tl.constexpr,
):  # fmt: skip
    """T > 1 new tokens on one [BV, Dk] state tile, streamed in [BV, BKC] key chunks: each chunk is read, folded,
    written back and multiplied with the chunk of [K; Q] (the new tokens' raw keys and queries, normalised after
    the loop), so a program holds one chunk, not the tile, and the pipeliner keeps the next chunks in flight.
    Nothing before the loop's end reads what ``_chunk_prep_kernel`` writes, so with OVERLAP it runs beside it."""
    if not OVERLAP:
        pdl_enter(PDL)
    i_v, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    hk = i_h // (HV // HK)
    rt = tl.arange(0, TP)
    rc = tl.arange(0, BKC)
    rv = i_v * BV + tl.arange(0, BV)
    mv = rv < DV
    mt = rt < T
    mvt = mv[:, None] & mt[None, :]
    row = (i_b * T + rt).to(tl.int64)
    slot, phase, n = _slot_position(slot_ptr, ring_phase_ptr, pending_ptr, i_b)
    tok = (slot * 2 + phase) * Tmax + rt
    g_tot, UwT = _pending_writes(ring_u_ptr, ring_g_ptr, tok, n, i_h, rt, rv, mv, HV, DV)
    written = _state_written(rv, n, DV)

    s_base = state_ptr + (slot * HV + i_h) * DK * DV
    SKQ = tl.zeros([BV, 2 * TP], dtype=tl.float32)  # S0 [K; Q]^T, unnormalised
    kk = tl.zeros([TP], dtype=tl.float32)
    qq = tl.zeros([TP], dtype=tl.float32)
    for c in tl.range(0, BK, BKC, num_stages=STAGES):
        rk = c + rc
        mk = rk < DK
        s_ptrs = s_base + rk[None, :] * DV + rv[:, None]
        St = tl.load(s_ptrs, mask=mv[:, None] & mk[None, :], other=0.0)
        mtk = mt[:, None] & mk[None, :]
        Kc = tl.load(k_ptr + row[:, None] * sk + hk * DK + rk[None, :], mask=mtk, other=0.0).to(tl.float32)
        Qc = tl.load(q_ptr + row[:, None] * sq + hk * DK + rk[None, :], mask=mtk, other=0.0).to(tl.float32)
        St = _fold(St, UwT, g_tot, ring_k_ptr, tok, n, rt, hk, rk, mk, HK, DK, PREC)
        tl.store(s_ptrs, St, mask=written & mk[None, :])
        SKQ = tl.dot(St, tl.trans(tl.reshape(tl.permute(tl.join(Kc, Qc), (2, 0, 1)), (2 * TP, BKC))), SKQ,
                     input_precision=PREC)  # fmt: skip
        kk += tl.sum(Kc * Kc, 1)
        qq += tl.sum(Qc * Qc, 1)
    X, Y = tl.split(tl.permute(tl.reshape(SKQ, (BV, 2, TP)), (0, 2, 1)))
    X = X * tl.rsqrt(kk + eps)[None, :]
    Y = Y * (tl.rsqrt(qq + eps) * scale)[None, :]
    VT = tl.load(v_ptr + row[None, :] * sv + i_h * DV + rv[:, None], mask=mvt, other=0.0).to(tl.float32)
    if OVERLAP:  # launched beside _chunk_prep_kernel: what the loop read was written before it; what follows it wrote
        pdl_enter(True)

    # The new tokens in WY form (module docstring), with their T x T matrices from _chunk_prep_kernel.
    # All three loads of the prep kernel's output go out before any is used: one round trip, not three in a row.
    park = (slot * 2 + 1 - phase) * Tmax + rt
    base = mats_ptr + (i_b * HV + i_h).to(tl.int64) * 2 * TP * TP
    mat_t = rt[None, :] * TP + rt[:, None]  # transposed reads: the products need inv^T and P^T
    g_new = tl.load(ring_g_ptr + park * HV + i_h, mask=mt, other=0.0)
    inv_t = tl.load(base + mat_t)
    P_t = tl.load(base + TP * TP + mat_t)
    decay = tl.exp(tl.cumsum(g_new, 0))
    UT = tl.dot(VT - decay[None, :] * X, inv_t, input_precision=PREC)
    OT = tl.dot(UT, P_t, decay[None, :] * Y, input_precision=PREC)
    tl.store(o_ptr + (row[None, :] * HV + i_h) * DV + rv[:, None], OT.to(o_ptr.dtype.element_ty), mask=mvt)
    # Park the new tokens' writes in ring half 1 - phase (their k and g are parked by the prep kernel).
    tl.store(ring_u_ptr + (park[None, :] * HV + i_h) * DV + rv[:, None], UT, mask=mvt)


@triton.jit
def _causal_conv_verify_kernel(
    x_ptr, w_ptr, buf_ptr, pending_ptr, slot_ptr, y_ptr, T, C, L, sx,
    W: tl.constexpr, KW: tl.constexpr, BC: tl.constexpr, TP: tl.constexpr, WP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_enter(PDL)
    i_c, i_b = tl.program_id(0), tl.program_id(1)
    slot = tl.load(slot_ptr + i_b).to(tl.int64)
    start = tl.load(pending_ptr + slot)
    rc = i_c * BC + tl.arange(0, BC)
    mc = rc < C
    rt = tl.arange(0, TP)
    mt = rt < T
    buf_row = buf_ptr + slot * L * C + rc  # position 0 of the slot's window; positions are C apart
    x_row = x_ptr + (i_b * T).to(tl.int64) * sx + rc

    # y_t = sum_j w_j full_{t+j}, full = committed window (W entries) then the T new inputs.
    acc = tl.zeros([TP, BC], dtype=tl.float32)
    for j in tl.static_range(KW):
        p = rt + j
        in_win = p < W
        old = tl.load(buf_row[None, :] + (start + p[:, None]) * C, mask=(in_win & mt)[:, None] & mc[None, :], other=0.0)
        new = tl.load(x_row[None, :] + (p - W)[:, None] * sx, mask=(~in_win & mt)[:, None] & mc[None, :], other=0.0)
        w_j = tl.load(w_ptr + rc * KW + j, mask=mc, other=0.0).to(tl.float32)
        acc += (old.to(tl.float32) + new.to(tl.float32)) * w_j[None, :]

    # Roll the window back to the committed position and append the new inputs.
    rw = tl.arange(0, WP)
    mw = (rw < W)[:, None] & mc[None, :]
    win = tl.load(buf_row[None, :] + (start + rw[:, None]) * C, mask=mw, other=0.0)
    xt = tl.load(x_row[None, :] + rt[:, None] * sx, mask=mt[:, None] & mc[None, :], other=0.0)
    tl.debug_barrier()  # every read of this slot's rows is done before they are overwritten
    tl.store(buf_row[None, :] + rw[:, None] * C, win, mask=mw)
    tl.store(buf_row[None, :] + (W + rt[:, None]) * C, xt.to(buf_ptr.dtype.element_ty), mask=mt[:, None] & mc[None, :])

    y = acc * tl.sigmoid(acc)
    tl.store(y_ptr + (i_b * T + rt[:, None]).to(tl.int64) * C + rc[None, :], y.to(y_ptr.dtype.element_ty),
             mask=mt[:, None] & mc[None, :])  # fmt: skip


def token_rows(x: Tensor) -> tuple[Tensor, int]:
    """``x`` [B, T, ...] as (tensor, elements between consecutive tokens) for kernels that address token
    ``b * T + t`` as one strided row: views of a fused projection's output qualify as they are (no copy
    launched per call), anything else is made contiguous first."""
    B, T = x.shape[:2]
    features = math.prod(x.shape[2:])
    dense = x.is_contiguous() or x.shape[2:].numel() == 0 or x[:1, :1].is_contiguous()
    row = x.stride(1) if T > 1 else x.stride(0)
    if not dense or (B > 1 and T > 1 and x.stride(0) != T * row):
        return x.contiguous(), features
    return x, row if B * T > 1 else features


def _rows_16_byte_aligned(*rows: tuple[Tensor, int]) -> bool:
    """Whether Triton can prove every token row 16-byte aligned, as the Hopper kernel's cp.async copies of keys and
    queries need: it does so only for bases aligned to 16 bytes and strides divisible by 16 (its specializations).
    Other views (a fused output whose row is not a multiple of 16 elements) take the Triton kernels."""
    return all(t.data_ptr() % 16 == 0 and stride % 16 == 0 for t, stride in rows)


def _check_launch(inputs: tuple[Tensor, ...], buffers: tuple[Tensor, ...]) -> None:
    """The kernels index raw memory: state and buffers must be contiguous, everything on one device
    (CPU: the interpreter)."""
    device = inputs[0].device
    for t in inputs + buffers:
        if t.device != device:
            raise OcriaError(f"replay_ssm kernel: tensors on {t.device} and {device}; put them on one device")
    for t in buffers:
        if not t.is_contiguous():
            raise OcriaError("replay_ssm kernel: a state or buffer tensor is not contiguous")
    if device.type == "cpu" and not isinstance(_verify_one_kernel, InterpretedFunction):
        raise OcriaError("replay_ssm kernel on CPU needs TRITON_INTERPRET=1 set before the kernel is imported")


# The interpreter has no SMs: CPU runs take the H200's count, so they launch the tiles an H200 would.
H200_SM_COUNT = 132
BLOCK_V_CHOICES = (64, 32, 16)
DEEP_GRID_PROGRAMS_PER_SM = 8
DEEP_GRID_MAX_REGISTERS = 168
KEY_CHUNK = 32
# Deep grids, key chunks, tf32 products (bf16 / fp16 inputs): five programs per SM. The block kernel compiles to 108
# registers (four per SM) since the pending writes are weighted once per tile; capped at 96 it does not spill (the
# tf32x3 build for fp32 inputs needs 138 and would; it keeps the deep-grid cap), and batch 64 at T = 16 took 121-123
# against 139-142 µs uncapped on the H200; at 80 (six per SM) it spills and took 145. Shallow grids are not
# capped: batch 16 was faster without (35.6-35.9 against 37.2-37.7 µs).
KEY_CHUNK_MAX_REGISTERS = 96


@lru_cache(maxsize=16)
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return H200_SM_COUNT
    return torch.cuda.get_device_properties(device).multi_processor_count


def deep_grid(programs: int, sm_count: int) -> bool:
    """Whether a launch gives every SM ``DEEP_GRID_PROGRAMS_PER_SM`` state tiles: throughput, not one program's
    latency, then sets the step's time."""
    return programs >= DEEP_GRID_PROGRAMS_PER_SM * sm_count


def launch_config(batch: int, num_v_heads: int, head_v_dim: int, sm_count: int) -> tuple[int, int, int | None]:
    """(block_v, num_warps, max_registers) of a verify launch: the widest column tile whose grid still gives
    every SM two programs, 16 columns when none does; a register cap once the grid is deep.

    A program runs its state load, fold, products and store one after another, so a small grid (64
    programs for batch 1 at Qwen3.5 heads with 64 columns) leaves SMs idle and exposes that chain;
    narrower tiles spread the same state over more programs. Wide tiles stay where the grid is large:
    they feed wgmma. A 64-column whole-tile program (the one-token kernel) needs ~210 registers, two per SM;
    capped at ``DEEP_GRID_MAX_REGISTERS`` (a few hundred bytes of spills) three fit, which pays once every SM has
    ``DEEP_GRID_PROGRAMS_PER_SM`` programs to run (on the H200: batch >= 32 faster, batch 8 slower). The block
    kernel's key chunks take ``KEY_CHUNK_MAX_REGISTERS`` instead.
    """
    for bv in BLOCK_V_CHOICES[:-1]:
        programs = triton.cdiv(head_v_dim, bv) * num_v_heads * batch
        if programs >= 2 * sm_count:
            deep = bv == 64 and deep_grid(programs, sm_count)
            return bv, 4, DEEP_GRID_MAX_REGISTERS if deep else None
    return BLOCK_V_CHOICES[-1], 4, None


def key_chunking(block_v: int, block_k: int) -> tuple[int, int]:
    """(key chunk, pipeline stages) of a T > 1 launch of [block_v, block_k] state tiles.

    Chunks of ``KEY_CHUNK`` keys hold 96-108 registers, four or five programs per SM, against ~220 for the whole
    tile, and the next chunks' loads are in flight while one is folded: batch 16-64 at T = 16 9-10% faster than the
    whole tile on the H200. The 16-column tiles of the smallest grids keep the
    whole tile, one load and no loop: there one program's latency is the step's (batch 1: 9.4 against 13.3 µs).
    Three stages at every batch from 4 to 64; two or four and register caps of 64-88 were no faster.
    """
    if block_v <= BLOCK_V_CHOICES[-1]:
        return block_k, 1
    return KEY_CHUNK, 3


def block_registers(deep_cap: int | None, key_chunk: int, block_k: int, precision: str) -> int | None:
    """Register cap of a T > 1 block-kernel launch that ``launch_config`` capped at ``deep_cap`` (None: uncapped):
    the key-chunked tf32 build takes ``KEY_CHUNK_MAX_REGISTERS``, every other build the deep-grid cap."""
    if deep_cap and key_chunk < block_k and precision == "tf32":
        return KEY_CHUNK_MAX_REGISTERS
    return deep_cap


def warp_specialized(device: torch.device, dtype: torch.dtype, Hk: int, Hv: int, Dk: int, Dv: int, Tmax: int,
                     launch: Launch = DEFAULT_LAUNCH) -> bool:
    """Whether a default T > 1 launch of these shapes takes the warp-specialized Hopper kernel (``hopper.py``)."""
    return Launch.REPLAY_SSM_WS in launch and hopper.ws_supported(device, dtype, Hk, Hv, Dk, Dv, Tmax)


def replay_verify_kernel(
    q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor,
    state: Tensor, ring_k: Tensor, ring_u: Tensor, ring_g: Tensor,
    ring_phase: Tensor, pending_len: Tensor, slot_ids: Tensor,
    block_v: int | None = None, num_warps: int | None = None, precision: str | None = None,
    max_registers: int | None = None, key_chunk: int | None = None, stages: int | None = None,
    launch: Launch = DEFAULT_LAUNCH,
) -> Tensor:  # fmt: skip
    """Triton launch of ``ocria.models.gdn.replay_verify_reference`` (same arguments and effects); state and ring
    must be fp32. ``block_v`` / ``num_warps`` / ``max_registers`` default to ``launch_config`` for this batch and device
    (the register cap only when no tile is given), ``key_chunk`` / ``stages`` (T > 1) to ``key_chunking``."""
    B, T, Hk, Dk = k.shape
    Hv, Dv = v.shape[-2:]
    Tmax = ring_k.shape[2]
    if state.dtype != torch.float32 or ring_k.dtype != torch.float32:
        raise OcriaError(f"replay_verify kernel needs fp32 state and ring buffers, got {state.dtype}")
    if T > Tmax:
        raise OcriaError(f"replay_verify: {T} new tokens exceed the ring capacity Tmax={Tmax}")
    if key_chunk is not None and (key_chunk < 16 or key_chunk & (key_chunk - 1)):
        raise OcriaError(f"replay_verify: key_chunk={key_chunk}; use a power of two >= 16")
    if stages is not None and stages < 1:
        raise OcriaError(f"replay_verify: stages={stages}; use 1 or more")
    (q, sq), (k, sk), (v, sv), (a, sa), (b, sb) = (token_rows(t) for t in (q, k, v, a, b))
    A_log, dt_bias, slot_ids = A_log.contiguous(), dt_bias.contiguous(), slot_ids.contiguous()
    _check_launch((q, k, v, a, b), (state, ring_k, ring_u, ring_g, ring_phase, pending_len, slot_ids))
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if B == 0:
        return o
    BK = max(16, triton.next_power_of_2(Dk))
    if Launch.INVARIANT in launch and T > 0 and precision is None and max_registers is None:
        # One tile shape and warp count at every batch and T (``block_v`` / ``num_warps`` only as benchmarks set them)
        BV = max(16, min(block_v or INVARIANT_BLOCK_V, triton.next_power_of_2(Dv)))
        _replay_sequential_kernel[(triton.cdiv(Dv, BV), Hv, B)](
            q, k, v, a, b, A_log, dt_bias, state, ring_k, ring_u, ring_g, ring_phase, pending_len, slot_ids,
            o, T, Tmax, Dk**-0.5, 1e-6, sq, sk, sv, sa, sb,
            HK=Hk, HV=Hv, DK=Dk, DV=Dv, BK=BK, BV=BV, num_warps=num_warps or INVARIANT_WARPS,
            **pdl_args(v.device, launch),
        )  # fmt: skip
        return o
    tuned = any(x is not None for x in (block_v, num_warps, precision, max_registers, key_chunk, stages))
    aligned = state.data_ptr() % 16 == 0 and _rows_16_byte_aligned((q, sq), (k, sk))  # TMA base, cp.async rows
    if T > 1 and not tuned and aligned and warp_specialized(v.device, v.dtype, Hk, Hv, Dk, Dv, Tmax, launch):
        hopper.ws_verify(q, k, v, a, b, A_log, dt_bias, state, ring_k, ring_u, ring_g, ring_phase, pending_len,
                         slot_ids, o, T, (sq, sk, sv, sa, sb), launch)  # fmt: skip
        return o
    auto_bv, auto_warps, auto_registers = launch_config(B, Hv, Dv, _sm_count(v.device))
    auto_launch = block_v is None and num_warps is None and max_registers is None
    if auto_launch:
        max_registers = auto_registers
    block_v, num_warps = block_v or auto_bv, num_warps or auto_warps
    BV = max(16, min(block_v, triton.next_power_of_2(Dv)))
    if 64 <= BV < 16 * num_warps:
        # The state tile is too short for its warpgroups, so the T-wide products are split into n=8
        # wgmma tiles; Triton 3.6 addresses shared memory out of bounds for tf32 n=8 (seen on the H200).
        raise OcriaError(f"replay_verify: block_v={BV} with {num_warps} warps; use block_v >= {16 * num_warps}")
    TP = max(16, triton.next_power_of_2(Tmax))
    precision = precision or DOT_PRECISION[v.dtype]
    grid = (triton.cdiv(Dv, BV), Hv, B)
    common = (q, k, v, a, b, A_log, dt_bias, state, ring_k, ring_u, ring_g, ring_phase, pending_len, slot_ids, o)
    tile_args = dict(HK=Hk, HV=Hv, DK=Dk, DV=Dv, BK=BK, BV=BV, TP=TP, PREC=precision, num_warps=num_warps,
                     **({"maxnreg": max_registers} if max_registers else {}))  # fmt: skip
    if T == 1:
        _verify_one_kernel[grid](*common, Tmax, Dk**-0.5, 1e-6, sq, sk, sv, sa, sb,
                                 PREFETCH=BV <= PREFETCH_MAX_BLOCK_V, **tile_args,
                                 **pdl_args(v.device, launch))  # fmt: skip
        return o
    # Per value head (I + A)^-1 diag(beta) and P from the prep kernel, read by the block kernel after its loop.
    mats = torch.empty((B, Hv, 2, TP, TP), dtype=torch.float32, device=v.device)
    overlap = OVERLAP_PREP and pdl_capable(v.device)
    # Deep grids: one prep program per key head (its Gram and score matrices once for all its value heads, half
    # the programs at Qwen3.5's GQA: batch 32 70.8 -> 67.3 µs); shallow ones keep one per value head, whose
    # shorter chain is the step's latency there (batch 8 21.6 against 23.0 µs on the H200).
    prep_heads = Hv // Hk if deep_grid(math.prod(grid), _sm_count(v.device)) else 1
    _chunk_prep_kernel[(Hv // prep_heads, B)](
        q, k, a, b, A_log, dt_bias, ring_k, ring_g, ring_phase, slot_ids, mats, T, Tmax, Dk**-0.5, 1e-6, sq, sk, sa, sb,
        HK=Hk, HV=Hv, DK=Dk, BK=BK, TP=TP, HEADS=prep_heads, PREC=precision, num_warps=PREP_WARPS, OVERLAP=overlap,
        **pdl_args(v.device, launch),
    )  # fmt: skip
    auto_chunk, auto_stages = key_chunking(BV, BK)
    BKC = min(key_chunk or auto_chunk, BK)
    if auto_launch and auto_registers:  # launch_config capped this launch (a deep grid)
        tile_args["maxnreg"] = block_registers(auto_registers, BKC, BK, precision)
    _verify_block_kernel[grid](*common, mats, T, Tmax, Dk**-0.5, 1e-6, sq, sk, sv, sa, sb,
                               BKC=BKC, STAGES=stages or auto_stages, OVERLAP=overlap,
                               **tile_args, **pdl_args(v.device, launch, overlap))  # fmt: skip
    return o


def causal_conv_verify_kernel(
    x: Tensor, weight: Tensor, conv_buf: Tensor, pending_len: Tensor, slot_ids: Tensor, block_c: int = 128,
    launch: Launch = DEFAULT_LAUNCH,
) -> Tensor:
    """Triton launch of ``ocria.models.gdn.causal_conv_verify_reference`` (same arguments and effects)."""
    B, T, C = x.shape
    KW = weight.shape[-1]
    L = conv_buf.shape[1]
    if T > L - (KW - 1):
        raise OcriaError(f"causal_conv_verify: {T} new inputs exceed the buffer capacity {L - (KW - 1)}")
    (x, sx), weight, slot_ids = token_rows(x), weight.contiguous(), slot_ids.contiguous()
    _check_launch((x, weight), (conv_buf, pending_len, slot_ids))
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if B == 0:
        return y
    BC = min(block_c, triton.next_power_of_2(C))
    grid = (triton.cdiv(C, BC), B)
    _causal_conv_verify_kernel[grid](
        x, weight, conv_buf, pending_len, slot_ids, y, T, C, L, sx,
        W=KW - 1, KW=KW, BC=BC, TP=triton.next_power_of_2(T), WP=max(1, triton.next_power_of_2(KW - 1)),
        **pdl_args(x.device, launch),
    )  # fmt: skip
    return y
