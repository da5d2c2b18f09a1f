"""Warp-specialized ReplaySSM verify for Hopper (Gluon): T > 1, bf16 inputs, Dk = 128, two value heads per key head.

Same contract and effects as ``kernel.replay_verify_kernel`` (and ``ocria.models.gdn.replay_verify_reference``), one
launch per step instead of the prep kernel plus the block kernel. Why: on the H200 the block kernel's programs could
neither hide the prep kernel's T x T work nor keep enough state loads in flight at moderate batch; here each CTA takes
whole (batch row, key head) groups and splits the work among partitions that run side by side:

- two state loaders (one warp each): TMA copies of the state's [32 keys, 64 columns] chunks into a 4-slot
  shared-memory ring per consumer (mbarriers ``full`` / ``empty``);
- two consumers (one warpgroup each; consumer c takes value head 2 hk + c, both 64-column tiles): per chunk the
  fold of the pending tokens (one tf32 wgmma, the chunk as the accumulator), the folded chunk stored straight
  from the accumulator, and the products with the new tokens' raw keys and queries (two bf16 wgmmas: the folded
  chunk rounded to bf16 in its own registers is already the next wgmma's A fragment); then the tile's tail, the
  new tokens in WY form (the math in ``kernel.py``'s docstring);
- one prep partition (two warps), a group or two ahead of the consumers: the Gram and score matrices of the raw bf16
  keys and queries on the tensor cores (``mma.sync``; bf16 x bf16 products are exact in fp32), norms from their
  diagonals, gates, (I + A)^-1 diag(beta) by repeated squaring (tf32 ``mma.sync``), decayed scores and exp(G),
  passed to each consumer with the log-decays through a 2-slot shared-memory ring (mbarriers ``mfull`` /
  ``mempty``); the consumers park the writes U, the log-decays and (consumer 0) the normalised keys for the next
  step. Its global loads go out a group ahead (keys and queries by cp.async into a second staging buffer): a
  per-partition clock timeline showed the consumers waiting 1-6 µs per group for the prep, whose loads went out
  inside the group, one after another. The state loaders start when the prep's first keys and queries have
  landed (mbarrier ``prep_loaded``), so those are not queued behind the state stream.

The consumers wait for the prep only after their chunk loop, so the fold and the state traffic overlap it. Each
choice here was timed on the H200 against its alternative in the same process: the kernel
against the prep and block kernels; the prep's loads a group ahead; the parking in the consumers rather than the
prep; the inverse on the tensor cores and the gated state loaders; the consumers' keys and queries by cp.async a
tile ahead, with their inputs' weights before the next tile's loads; and, with ``OCRIA_PDL=1`` (launch.py), the
wait for the kernel before it placed after the shared-memory setup.
Gluon is experimental and its API moves between Triton releases, so this path runs only on the release it was
checked with (``CHECKED_TRITON``); every other case takes the block kernel.
"""

import torch
import triton
from torch import Tensor
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ocria.plugins.launch import capability, pdl_args, sm_count
from ocria.plugins.policy import Launch

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import NVMMADistributedLayout, async_copy, mma_v2
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError:  # an older Triton: no Gluon, the block kernel serves every launch
    gluon = None

# Triton release (major.minor) the kernel was compiled and checked against float64 with on the H200.
CHECKED_TRITON = ("3.6",)
KEY_CHUNK = 32  # keys per TMA copy and per fold wgmma
BLOCK_V = 64  # value columns per tile: a consumer does two tiles per value head
TOKENS = 16  # the padded block (TP): the T x T matrices are [16, 16]
STAGES = 4  # state chunks in flight per consumer
PREP_SLOTS = 2  # groups the prep partition may run ahead
# setmaxnreg per partition: the first consumer keeps the launch's 168, the second takes 192 and the warpgroup of
# loaders and prep 144 (they share one value); the split that spilled least in a static sm_90a compile.
CONSUMER_REGS = 192
PREP_REGS = 144
LOADER_REGS = 40


def ws_supported(device: torch.device, dtype: torch.dtype, Hk: int, Hv: int, Dk: int, Dv: int, Tmax: int) -> bool:
    """Whether a T > 1 verify launch of these shapes can take this kernel: an sm_90 GPU, the checked Triton, bf16
    inputs, 128-dim keys, 64-column value tiles, two value heads per key head and a ring of at most 16 tokens."""
    return (
        gluon is not None
        and triton.__version__.startswith(CHECKED_TRITON)
        and device.type == "cuda"
        and capability(device.index) == (9, 0)
        and dtype == torch.bfloat16
        and Dk == 128
        and Dv % BLOCK_V == 0
        and Hv == 2 * Hk
        and max(16, triton.next_power_of_2(Tmax)) == TOKENS
    )


if gluon is not None:
    # The prep's four vectors in each consumer-ring slot (``_ring_vec``): key and query norm factors, decays exp(G),
    # log-decays g.
    VEC_KF, VEC_QF, VEC_DN, VEC_G = gl.constexpr(0), gl.constexpr(1), gl.constexpr(2), gl.constexpr(3)
    RING_VECS = gl.constexpr(4)

    @gluon.jit
    def _ring_vec(vec_ring, buf, k: gl.constexpr):
        """Vector k (``VEC_*``) of the consumer-ring slot ``buf``."""
        return vec_ring.index(buf * RING_VECS + k)

    @gluon.jit
    def _pick(jt, vec, j):
        """Element j of a small vector every thread holds (0 when j is past its end)."""
        return gl.sum(gl.where(jt == j, vec, 0), 0)

    @gluon.jit
    def _group_slots(slot_ptr, ring_phase_ptr, pending_ptr, n_groups, first, stride, HK: gl.constexpr,
                     MAXT: gl.constexpr, layout: gl.constexpr):  # fmt: skip
        """Slot, ring phase and pending count of every group this partition walks (first, first + stride, ...), as
        [MAXT] vectors: two round trips once, so no tile waits on a chain of dependent scalar loads."""
        jt = gl.arange(0, MAXT, layout)
        gv = first + jt * stride
        ok = gv < n_groups
        slot = gl.load(slot_ptr + gv // HK, mask=ok, other=0).to(gl.int64)
        phase = gl.load(ring_phase_ptr + slot, mask=ok, other=0).to(gl.int64)
        return jt, slot, phase, gl.load(pending_ptr + slot, mask=ok, other=0)

    @gluon.jit
    def _tile_inputs(i_b, i_h, i_v, slot, phase, n, q_ptr, k_ptr, ring_k_ptr, ring_u_ptr, ring_g_ptr, kq_dst, T, Tmax,
                     sq, sk, HK: gl.constexpr, HV: gl.constexpr, DK: gl.constexpr, DV: gl.constexpr, BV: gl.constexpr,
                     TP: gl.constexpr, BKC: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
        """What a tile needs before its chunks that nothing in this launch writes: the pending tokens' log-decays [TP]
        (every thread holds all of them), writes U^T [BV, TP] and keys [TP, DK] into registers; the new tokens' raw
        keys and queries as [DK / BKC x TP, BKC] key chunks (bf16, as they come) copied by cp.async into ``kq_dst``
        (one commit group), so they take no registers through the chunk loop before theirs."""
        COLS: gl.constexpr = gl.BlockedLayout([4, 1], [16, 2], [1, num_warps], [0, 1])
        P3: gl.constexpr = gl.BlockedLayout([TP, 1], [16, 2], [1, num_warps], [0, 1])
        KPL: gl.constexpr = gl.BlockedLayout([4, 1], [1, 32], [num_warps, 1], [0, 1])
        L2: gl.constexpr = gl.BlockedLayout([1, 8], [32 * 8 // BKC, BKC // 8], [num_warps, 1], [1, 0])
        NKC: gl.constexpr = DK // BKC
        hk = i_h // (HV // HK)
        tok0 = (slot * 2 + phase) * Tmax
        rt_c = gl.arange(0, TP, layout=gl.SliceLayout(0, COLS))
        rv_c = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(1, COLS))
        UpT = gl.load(ring_u_ptr + ((tok0 + rt_c[None, :]) * HV + i_h) * DV + rv_c[:, None],
                      mask=(rt_c < n)[None, :], other=0.0)  # fmt: skip
        rs = gl.arange(0, TP, layout=gl.SliceLayout(1, P3))
        gp = gl.load(ring_g_ptr + (tok0 + rs) * HV + i_h, mask=rs < n, other=0.0)
        rt_p = gl.arange(0, TP, layout=gl.SliceLayout(1, KPL))
        rk_p = gl.arange(0, DK, layout=gl.SliceLayout(0, KPL))
        Kp = gl.load(ring_k_ptr + ((tok0 + rt_p[:, None]) * HK + hk) * DK + rk_p[None, :],
                     mask=(rt_p < n)[:, None], other=0.0)  # fmt: skip
        rr = gl.arange(0, NKC * TP, layout=gl.SliceLayout(1, L2))  # row (c, t): key chunk c of token t
        rj = gl.arange(0, BKC, layout=gl.SliceLayout(0, L2))
        rt = rr % TP
        row = (i_b * T + rt).to(gl.int64)
        col = hk * DK + (rr // TP)[:, None] * BKC + rj[None, :]
        live = (rt < T)[:, None]
        async_copy.async_copy_global_to_shared(kq_dst.slice(0, NKC * TP), k_ptr + row[:, None] * sk + col, mask=live)
        async_copy.async_copy_global_to_shared(kq_dst.slice(NKC * TP, NKC * TP), q_ptr + row[:, None] * sq + col,
                                               mask=live)  # fmt: skip
        async_copy.commit_group()
        return UpT, gp, Kp

    @gluon.jit
    def _tril_inverse(B, bufs, TP: gl.constexpr, MACC: gl.constexpr):
        """(I + A)^-1 for B = -A ([TP, TP], strictly lower) as (I + B)(I + B^2)(I + B^4)(I + B^8), as
        ``kernel._tril_inverse``: the products on the tensor cores in tf32 (the block kernel's precision for bf16
        inputs) with B and the inverse kept in the MMA layout. ``bufs``: seven [TP, TP] fp32 shared-memory buffers,
        B^(2^i) in bufs[i] and the partial inverses in bufs[4 + i], each its own allocation and written once per call,
        so the only barriers are the three between a product's store and its reads. (On the CUDA cores each product
        converted its operands' layouts and took 770 FFMA a group.)"""
        MA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MACC, k_width=1)
        MB: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MACC, k_width=1)
        bufs[0].store(B)
        gl.thread_barrier()
        ri = gl.arange(0, TP, layout=gl.SliceLayout(1, MACC))
        rj = gl.arange(0, TP, layout=gl.SliceLayout(0, MACC))
        inv = bufs[0].load(MACC) + gl.where(ri[:, None] == rj[None, :], 1.0, 0.0)
        zero = gl.zeros([TP, TP], gl.float32, MACC)
        for i in gl.static_range(3):
            B = mma_v2(bufs[i].load(MA), bufs[i].load(MB), zero, input_precision="tf32")
            bufs[i + 1].store(B)
            bufs[4 + i].store(inv)
            gl.thread_barrier()
            inv = mma_v2(bufs[4 + i].load(MA), bufs[i + 1].load(MB), inv, input_precision="tf32")
        return inv

    @gluon.jit
    def _publish(inv, P, kf, qf, dn, g, inv_ring, p_ring, vec_ring, mfull, mempty, buf, ph):
        """One value head's prep into its consumer's ring slot ``buf``, once the consumer has released it: the
        matrices and its four vectors."""
        mbarrier.wait(mempty.index(buf), ph ^ 1)
        inv_ring.index(buf).store(inv)
        p_ring.index(buf).store(P)
        _ring_vec(vec_ring, buf, VEC_KF).store(kf)
        _ring_vec(vec_ring, buf, VEC_QF).store(qf)
        _ring_vec(vec_ring, buf, VEC_DN).store(dn)
        _ring_vec(vec_ring, buf, VEC_G).store(g)
        fence_async_shared()
        mbarrier.arrive(mfull.index(buf))

    @gluon.jit
    def _gate_inputs(a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, row, mt, i_h, sa, sb):
        """Value head i_h's a and b at token rows ``row`` (0 where ``mt`` is off), A_log and dt_bias."""
        a = gl.load(a_ptr + row * sa + i_h, mask=mt, other=0.0)
        b = gl.load(b_ptr + row * sb + i_h, mask=mt, other=0.0)
        return a, b, gl.load(A_log_ptr + i_h), gl.load(dt_bias_ptr + i_h)

    @gluon.jit
    def _decay_gates(gates, mt):
        """(log-decays g, betas) of one value head's tokens (0 where ``mt`` is off) from its ``_gate_inputs``."""
        a, b, A_log, dt_bias = gates
        x = a.to(gl.float32) + dt_bias.to(gl.float32)
        softplus = gl.where(x > 20.0, x, gl.log(1.0 + gl.exp(gl.minimum(x, 20.0))))
        g_j = gl.where(mt, -gl.exp(A_log.to(gl.float32)) * softplus, 0.0)
        beta_j = gl.where(mt, 1.0 / (1.0 + gl.exp(-b.to(gl.float32))), 0.0)
        return g_j, beta_j

    @gluon.jit
    def _prep_loads(q_ptr, k_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, kq_prep, kq, g, T, sq, sk, sa, sb,
                    HK: gl.constexpr, DK: gl.constexpr, TP: gl.constexpr, KL: gl.constexpr,
                    L2: gl.constexpr):  # fmt: skip
        """Issue group g's loads: its two value heads' gate inputs (``_gate_inputs``) into registers, then its raw
        keys and queries copied straight into ``kq_prep[kq]`` and ``kq_prep[kq + 1]`` (cp.async, one commit group),
        all used one group later. The barrier between them keeps ptxas from issuing the gate loads after the wait for
        the copies: for the first group they went out only then, and the loop's top waited a round trip for them."""
        i_b = g // HK
        hk = g % HK
        rj = gl.arange(0, TP, layout=gl.SliceLayout(0, L2))
        row = (i_b * T + rj).to(gl.int64)
        mt = rj < T
        gates = (_gate_inputs(a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, row, mt, hk * 2, sa, sb),
                 _gate_inputs(a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, row, mt, hk * 2 + 1, sa, sb))
        gl.thread_barrier()
        rtk = gl.arange(0, TP, layout=gl.SliceLayout(1, KL))
        rkk = gl.arange(0, DK, layout=gl.SliceLayout(0, KL))
        rowk = (i_b * T + rtk).to(gl.int64)[:, None]
        mk = (rtk < T)[:, None]
        async_copy.async_copy_global_to_shared(kq_prep.index(kq), k_ptr + rowk * sk + hk * DK + rkk[None, :], mask=mk)
        async_copy.async_copy_global_to_shared(kq_prep.index(kq + 1), q_ptr + rowk * sq + hk * DK + rkk[None, :],
                                               mask=mk)  # fmt: skip
        async_copy.commit_group()
        return gates

    @gluon.jit
    def _prep_partition(q_ptr, k_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, inv0, p0, vec0, inv1, p1, vec1,
                        mfull0, mempty0, mfull1, mempty1, kq_prep, inv_bufs, prep_loaded, n_groups, first, stride, T,
                        scale, eps, sq, sk, sa, sb, HK: gl.constexpr, DK: gl.constexpr, TP: gl.constexpr,
                        NB: gl.constexpr):  # fmt: skip
        """Per group (batch row, key head): the key head's norms and Gram and score matrices, then per value head
        (consumer c takes 2 hk + c) the gates, (I + A)^-1 diag(beta), the decayed scores, exp(G) and the log-decays
        into that consumer's ring. The consumers park the normalised keys and the log-decays for the next step: the
        parking address needs the slot's ring phase, two dependent round trips at the start, and in the SASS the
        loop's first use of the carried gate inputs waited for every load in flight, the phase's included; the
        first group's prep then began about a round trip late (on the H200, batch 8: 15.24-15.28 against
        15.25-15.53 µs at T = 16, 14.44-14.50 against 15.34-15.40 at T = 8). Every
        global load of a group goes out one group ahead, so no group waits on a round trip: the partition's pace is
        its arithmetic."""
        NW: gl.constexpr = 2
        L2: gl.constexpr = gl.SliceLayout(2, gl.BlockedLayout([1, 1, 8], [4, 8, 1], [NW, 1, 1], [2, 1, 0]))
        KL: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [NW, 1], [1, 0])  # [TP, DK] keys
        MACC: gl.constexpr = NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, NW], instr_shape=[16, 8])
        MA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MACC, k_width=2)
        MB: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MACC, k_width=2)
        ri = gl.arange(0, TP, layout=gl.SliceLayout(1, L2))
        rj = gl.arange(0, TP, layout=gl.SliceLayout(0, L2))
        eye = ri[:, None] == rj[None, :]
        lower = ri[:, None] > rj[None, :]
        causal = ri[:, None] >= rj[None, :]
        mt = rj < T
        nxt = _prep_loads(q_ptr, k_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, kq_prep, 0,
                          gl.minimum(first, n_groups - 1), T, sq, sk, sa, sb, HK, DK, TP, KL, L2)  # fmt: skip
        async_copy.wait_group(0)
        gl.thread_barrier()
        mbarrier.arrive(prep_loaded.index(0))  # the state loaders start now
        jg = 0
        for g in range(first, n_groups, stride):
            kq = jg % 2 * 2
            # The carried gate inputs become decays before the next group's loads go out: ptxas gives every global
            # load one scoreboard, so a later first use of them would wait for the new loads too.
            decays = (_decay_gates(nxt[0], mt), _decay_gates(nxt[1], mt))
            async_copy.wait_group(0)  # this group's copies have landed (issued a group ago)
            gl.thread_barrier()
            kb = kq_prep.index(kq).permute((1, 0)).load(MB)
            qb = kq_prep.index(kq + 1).permute((1, 0)).load(MB)
            zero = gl.zeros([TP, TP], gl.float32, MACC)
            kk = gl.convert_layout(mma_v2(kq_prep.index(kq).load(MA), kb, zero), L2)
            qk = gl.convert_layout(mma_v2(kq_prep.index(kq + 1).load(MA), kb, zero), L2)
            qq = gl.sum(gl.where(eye, gl.convert_layout(mma_v2(kq_prep.index(kq + 1).load(MA), qb, zero), L2), 0.0), 1)
            # The next group's loads into the other buffer, whose readers (the group before this one) are done;
            # after the products, so they do not hold up the first group's (at batch 8 a CTA's only group).
            nxt = _prep_loads(q_ptr, k_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, kq_prep, (jg + 1) % 2 * 2,
                              gl.minimum(g + stride, n_groups - 1), T, sq, sk, sa, sb, HK, DK, TP, KL, L2)  # fmt: skip
            kf_i = gl.rsqrt(gl.sum(gl.where(eye, kk, 0.0), 1) + eps)
            kf_j = gl.rsqrt(gl.sum(gl.where(eye, kk, 0.0), 0) + eps)
            qf_i = gl.rsqrt(qq + eps) * scale
            kkn = kk * kf_i[:, None] * kf_j[None, :]
            qkn = qk * qf_i[:, None] * kf_j[None, :]
            kf = gl.convert_layout(kf_i, gl.SliceLayout(0, L2))
            qf = gl.convert_layout(qf_i, gl.SliceLayout(0, L2))
            buf = jg % NB
            ph = (jg // NB) & 1
            for j in gl.static_range(2):
                g_j, beta_j = decays[j]
                gc_i = gl.sum(gl.where(causal, g_j[None, :], 0.0), 1)  # cumulative log-decay G, along i
                gc_j = gl.convert_layout(gc_i, gl.SliceLayout(0, L2))
                beta_i = gl.convert_layout(beta_j, gl.SliceLayout(1, L2))
                dec = gl.exp(gl.where(causal, gc_i[:, None] - gc_j[None, :], 0.0))
                inv = _tril_inverse(gl.where(lower, -beta_i[:, None] * dec * kkn, 0.0), inv_bufs, TP, MACC)
                beta_m = gl.convert_layout(beta_j, gl.SliceLayout(0, MACC))
                P = gl.where(causal, qkn * dec, 0.0)
                if j == 0:
                    _publish(inv * beta_m[None, :], P, kf, qf, gl.exp(gc_j), g_j, inv0, p0, vec0, mfull0, mempty0, buf,
                             ph)  # fmt: skip
                else:
                    _publish(inv * beta_m[None, :], P, kf, qf, gl.exp(gc_j), g_j, inv1, p1, vec1, mfull1, mempty1, buf,
                             ph)  # fmt: skip
            jg += 1
        async_copy.wait_group(0)  # nothing left in flight at exit (the last copies were of a group loaded for nothing)

    @gluon.jit
    def _state_loader(desc, bufs, full, empty, prep_loaded, slot_ptr, n_groups, first, stride, c: gl.constexpr,
                      NT: gl.constexpr, HK: gl.constexpr, HV: gl.constexpr, DK: gl.constexpr, BKC: gl.constexpr,
                      BV: gl.constexpr, STAGES: gl.constexpr, MAXT: gl.constexpr):  # fmt: skip
        """TMA copies of consumer c's state chunks, in the order it folds them, into its ring, from the moment the
        prep partition's first keys and queries have landed: issued at once, the state copies (8 MB at batch 8)
        queue ahead of them, and the prep, whose matrices every tile's tail waits for, starts last."""
        VEC: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
        jt = gl.arange(0, MAXT, VEC)
        gv = first + jt * stride
        slots = gl.load(slot_ptr + gv // HK, mask=gv < n_groups, other=0)
        mbarrier.wait(prep_loaded.index(0), 0)
        i = 0
        j = 0
        for g in range(first, n_groups, stride):
            row0 = ((_pick(jt, slots, j) * HV + (g % HK) * 2 + c) * DK).to(gl.int32)
            for i_v in gl.static_range(NT):
                for kc in gl.static_range(DK // BKC):
                    s = i % STAGES
                    mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
                    mbarrier.expect(full.index(s), BKC * BV * 4)
                    tma.async_copy_global_to_shared(desc, [row0 + kc * BKC, i_v * BV], full.index(s), bufs.index(s))
                    i += 1
            j += 1

    @gluon.jit
    def _park_prep(kq, vec_ring, buf, park, i_h, ring_k_ptr, ring_g_ptr, T, c: gl.constexpr, HK: gl.constexpr,
                   HV: gl.constexpr, DK: gl.constexpr, TP: gl.constexpr, BKC: gl.constexpr,
                   num_warps: gl.constexpr):  # fmt: skip
        """Park what the next step folds from the prep of this group: value head ``i_h``'s log-decays, and (consumer
        0) the key head's normalised keys, the raw keys of ``kq`` ([DK / BKC x TP, BKC] chunks) times their norm
        factors, in the ring's other half (``park``)."""
        VECL: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        rt = gl.arange(0, TP, layout=VECL)
        g = _ring_vec(vec_ring, buf, VEC_G).load(VECL)
        gl.store(ring_g_ptr + (park + rt) * HV + i_h, g, mask=rt < T)
        if c == 0:
            KC: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])  # [TP, BKC]
            rtc = gl.arange(0, TP, layout=gl.SliceLayout(1, KC))
            rj = gl.arange(0, BKC, layout=gl.SliceLayout(0, KC))
            kf = _ring_vec(vec_ring, buf, VEC_KF).load(gl.SliceLayout(1, KC))
            hk = i_h // (HV // HK)
            base = ring_k_ptr + ((park + rtc)[:, None] * HK + hk) * DK + rj[None, :]
            for kc in gl.static_range(DK // BKC):
                Kn = kq.slice(kc * TP, TP).load(KC).to(gl.float32) * kf[:, None]
                gl.store(base + kc * BKC, Kn, mask=(rtc < T)[:, None])

    @gluon.jit
    def _consumer(
        bufs, full, empty, kp_smem, kq_smem, inv_ring, p_ring, vec_ring, mfull, mempty,
        q_ptr, k_ptr, v_ptr, state_ptr, ring_k_ptr, ring_u_ptr, ring_g_ptr, ring_phase_ptr, pending_ptr, slot_ptr,
        o_ptr, n_groups, first, stride, T, Tmax, sq, sk, sv, c: gl.constexpr,
        NT: gl.constexpr, HK: gl.constexpr, HV: gl.constexpr, DK: gl.constexpr, DV: gl.constexpr, BKC: gl.constexpr,
        BV: gl.constexpr, TP: gl.constexpr, STAGES: gl.constexpr, NB: gl.constexpr, MAXT: gl.constexpr,
        num_warps: gl.constexpr,
    ):  # fmt: skip
        """One warpgroup folding and verifying value head 2 hk + c of its groups, both column tiles of each; the next
        tile's inputs are loaded while this one's chunks run."""
        acc16: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, TP, 8])  # fmt: skip
        accB: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                        instr_shape=[16, TP, 16])  # fmt: skip
        accS: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                        instr_shape=[16, BKC, 8])  # fmt: skip
        aS: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=accS, k_width=1)
        aB: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=accB, k_width=2)
        a16: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc16, k_width=1)
        COLS: gl.constexpr = gl.BlockedLayout([4, 1], [16, 2], [1, num_warps], [0, 1])
        P3: gl.constexpr = gl.BlockedLayout([TP, 1], [16, 2], [1, num_warps], [0, 1])
        VEC: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        VL: gl.constexpr = gl.BlockedLayout([8, 1], [8, 4], [1, num_warps], [0, 1])
        NKC: gl.constexpr = DK // BKC
        rs = gl.arange(0, TP, layout=gl.SliceLayout(1, P3))
        rt3 = gl.arange(0, TP, layout=gl.SliceLayout(0, P3))
        upto = rs[:, None] <= rt3[None, :]
        jt, slots, phases, ns = _group_slots(slot_ptr, ring_phase_ptr, pending_ptr, n_groups, first, stride, HK, MAXT,
                                             VEC)  # fmt: skip
        n_tiles = gl.maximum(gl.cdiv(n_groups - first, stride), 0) * NT
        g0 = gl.minimum(first, n_groups - 1)
        cur = _tile_inputs(g0 // HK, (g0 % HK) * 2 + c, 0, _pick(jt, slots, 0), _pick(jt, phases, 0),
                           _pick(jt, ns, 0), q_ptr, k_ptr, ring_k_ptr, ring_u_ptr, ring_g_ptr, kq_smem.index(0), T,
                           Tmax, sq, sk, HK, HV, DK, DV, BV, TP, BKC, num_warps)  # fmt: skip
        i = 0
        for kt in range(0, n_tiles):
            UpT, gp, Kp = cur
            kq = kq_smem.index(kt % 2)
            jg = kt // NT
            i_v = kt % NT
            g = first + jg * stride
            i_b = g // HK
            i_h = (g % HK) * 2 + c
            slot = _pick(jt, slots, jg)
            phase = _pick(jt, phases, jg)
            n = _pick(jt, ns, jg)
            jn = (kt + 1) // NT
            gn = gl.minimum(first + jn * stride, n_groups - 1)  # past the last tile: a valid one, loaded for nothing
            gl.thread_barrier()  # the tile before this one has read kq_smem[(kt + 1) % 2] and kp_smem
            # The pending writes weighted by their decay to the end, exp(g_tot - G_t): every thread holds all the
            # log-decays, so the sums stay in its registers. Computed before the next tile's loads go out: ptxas
            # tracks those loads with the scoreboard these inputs had, and their first use after the loads' issue
            # waited for the new loads too, a round trip per tile (2.4 us at batch 32).
            g_tot = gl.sum(gp, 0)
            G = gl.sum(gl.where(upto, gp[:, None], 0.0), 0)
            w = gl.convert_layout(gl.exp(g_tot - G), gl.SliceLayout(0, COLS))
            UwT = gl.convert_layout(UpT * w[None, :], aS)
            kp_smem.store(gl.permute(Kp, (1, 0)))
            cur = _tile_inputs(gn // HK, (gn % HK) * 2 + c, (kt + 1) % NT, _pick(jt, slots, jn),
                               _pick(jt, phases, jn), _pick(jt, ns, jn), q_ptr, k_ptr, ring_k_ptr, ring_u_ptr,
                               ring_g_ptr, kq_smem.index((kt + 1) % 2), T, Tmax, sq, sk, HK, HV, DK, DV, BV, TP, BKC,
                               num_warps)  # fmt: skip
            park = (slot * 2 + 1 - phase) * Tmax
            rt_v = gl.arange(0, TP, layout=gl.SliceLayout(0, VL))
            rv_v = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(1, VL))
            VT = gl.load(v_ptr + (i_b * T + rt_v).to(gl.int64)[None, :] * sv + i_h * DV + rv_v[:, None],
                         mask=(rt_v < T)[None, :], other=0.0)  # fmt: skip
            async_copy.wait_group(1)  # this tile's keys and queries (copied a tile ago) have landed
            fence_async_shared()
            gl.thread_barrier()
            decay_s = gl.exp(g_tot)
            s_base = state_ptr + (slot * HV + i_h) * DK * DV
            rk_s = gl.arange(0, BKC, layout=gl.SliceLayout(0, accS))
            rv_s = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(1, accS))
            X = gl.zeros([BV, TP], gl.float32, accB)
            Y = gl.zeros([BV, TP], gl.float32, accB)
            for kc in gl.static_range(NKC):
                s = i % STAGES
                mbarrier.wait(full.index(s), (i // STAGES) & 1)
                St = bufs.index(s).permute((1, 0)).load(accS)
                St = warpgroup_mma(UwT, kp_smem.slice(kc * BKC, BKC).permute((1, 0)), St * decay_s)
                # Released only now: the fold has consumed the slot's loads (a release right after issuing them let
                # the next copy overwrite the chunk before every load had landed).
                mbarrier.arrive(empty.index(s))
                # From the accumulator straight to global memory (nothing pending: the state stays as it is).
                gl.store(s_base + (kc * BKC + rk_s[None, :]) * DV + rv_s[:, None], St, mask=(rk_s < n * BKC)[None, :])
                Sb = gl.convert_layout(St.to(gl.bfloat16), aB)
                X = warpgroup_mma(Sb, kq.slice(kc * TP, TP).permute((1, 0)), X)
                Y = warpgroup_mma(Sb, kq.slice((NKC + kc) * TP, TP).permute((1, 0)), Y)
                i += 1
            # The new tokens in WY form, with the prep partition's matrices, norm factors and decays.
            buf = jg % NB
            mbarrier.wait(mfull.index(buf), (jg // NB) & 1)
            rt_t = gl.arange(0, TP, layout=gl.SliceLayout(0, acc16))
            kf = _ring_vec(vec_ring, buf, VEC_KF).load(gl.SliceLayout(0, acc16))
            qf = _ring_vec(vec_ring, buf, VEC_QF).load(gl.SliceLayout(0, acc16))
            dn = _ring_vec(vec_ring, buf, VEC_DN).load(gl.SliceLayout(0, acc16))
            X = gl.convert_layout(X, acc16) * kf[None, :]
            Y = gl.convert_layout(Y, acc16) * qf[None, :]
            rv_t = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(1, acc16))
            mt = (rt_t < T)[None, :]
            row_t = (i_b * T + rt_t).to(gl.int64)
            W = gl.convert_layout(VT, acc16).to(gl.float32) - dn[None, :] * X
            UT = warpgroup_mma(gl.convert_layout(W, a16), inv_ring.index(buf).permute((1, 0)),
                               gl.zeros([BV, TP], gl.float32, acc16), use_acc=False)  # fmt: skip
            OT = warpgroup_mma(gl.convert_layout(UT, a16), p_ring.index(buf).permute((1, 0)), dn[None, :] * Y)
            gl.store(o_ptr + (row_t[None, :] * HV + i_h) * DV + rv_t[:, None], OT.to(o_ptr.dtype.element_ty), mask=mt)
            gl.store(ring_u_ptr + ((park + rt_t[None, :]) * HV + i_h) * DV + rv_t[:, None], UT, mask=mt)
            if i_v == 0:
                _park_prep(kq, vec_ring, buf, park, i_h, ring_k_ptr, ring_g_ptr, T, c, HK, HV, DK, TP, BKC, num_warps)
            if i_v == NT - 1:
                mbarrier.arrive(mempty.index(buf))  # both column tiles have read this group's matrices
        async_copy.wait_group(0)  # nothing in flight at exit (the last copies were of a tile loaded for nothing)

    @gluon.jit
    def _consumer_buffers(desc, DK: gl.constexpr, BKC: gl.constexpr, BV: gl.constexpr, TP: gl.constexpr,
                          STAGES: gl.constexpr, NB: gl.constexpr):  # fmt: skip
        """One consumer's shared memory: its state-chunk ring, the pending keys, the new keys and queries, its prep
        ring, and their mbarriers."""
        tt: gl.constexpr = gl.NVMMASharedLayout.get_default_for([TP, TP], gl.float32)
        bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BKC, BV], desc.layout)
        kp_smem = gl.allocate_shared_memory(gl.float32, [DK, TP],
                                            gl.NVMMASharedLayout.get_default_for([DK, TP], gl.float32))  # fmt: skip
        kq_smem = gl.allocate_shared_memory(gl.bfloat16, [2, 2 * DK // BKC * TP, BKC],
                                            gl.NVMMASharedLayout.get_default_for([TP, BKC], gl.bfloat16))  # fmt: skip
        inv_ring = gl.allocate_shared_memory(gl.float32, [NB, TP, TP], tt)
        p_ring = gl.allocate_shared_memory(gl.float32, [NB, TP, TP], tt)
        vec_ring = gl.allocate_shared_memory(gl.float32, [NB * RING_VECS, TP], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mfull = gl.allocate_shared_memory(gl.int64, [NB, 1], mbarrier.MBarrierLayout())
        mempty = gl.allocate_shared_memory(gl.int64, [NB, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(full.index(s), count=1)
            mbarrier.init(empty.index(s), count=1)
        for s in gl.static_range(NB):
            mbarrier.init(mfull.index(s), count=1)
            mbarrier.init(mempty.index(s), count=1)
        fence_async_shared()
        return bufs, full, empty, kp_smem, kq_smem, inv_ring, p_ring, vec_ring, mfull, mempty

    @gluon.jit
    def _ws_verify_kernel(
        desc, q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, ring_k_ptr, ring_u_ptr, ring_g_ptr,
        ring_phase_ptr, pending_ptr, slot_ptr, o_ptr, n_groups, T, Tmax, scale, eps, sq, sk, sv, sa, sb,
        NT: gl.constexpr, HK: gl.constexpr, HV: gl.constexpr, DK: gl.constexpr, DV: gl.constexpr, BKC: gl.constexpr,
        BV: gl.constexpr, TP: gl.constexpr, STAGES: gl.constexpr, NB: gl.constexpr, MAXT: gl.constexpr,
        REGS: gl.constexpr, PREP_REGS: gl.constexpr, LOADER_REGS: gl.constexpr, PDL: gl.constexpr,
        num_warps: gl.constexpr,
    ):  # fmt: skip
        pid = gl.program_id(0)
        stride = gl.num_programs(0)
        bufs0, full0, empty0, kp0, kq0, inv0, p0, vec0, mfull0, mempty0 = _consumer_buffers(desc, DK, BKC, BV, TP,
                                                                                            STAGES, NB)  # fmt: skip
        bufs1, full1, empty1, kp1, kq1, inv1, p1, vec1, mfull1, mempty1 = _consumer_buffers(desc, DK, BKC, BV, TP,
                                                                                            STAGES, NB)  # fmt: skip
        # Rows of 16-byte vectors XOR-swizzled over 8 phases: unswizzled, the prep's ldmatrix reads of these 256-byte
        # rows were 8-way bank conflicts, 97% of the kernel's excess shared wavefronts at batch 16 (ncu source
        # view); the swizzle took 1-3% off the step on the H200. Two groups' keys and queries: the next group's
        # copies land while this one's are read.
        kq_prep = gl.allocate_shared_memory(gl.bfloat16, [4, TP, DK], gl.SwizzledSharedLayout(8, 1, 8, [1, 0]))
        # The inverse's operands, one allocation each: a store into a buffer of a shared allocation had the compiler
        # put a barrier before it for the reads of its neighbours (12 barriers a group).
        SQ: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        inv_bufs = (
            gl.allocate_shared_memory(gl.float32, [TP, TP], SQ), gl.allocate_shared_memory(gl.float32, [TP, TP], SQ),
            gl.allocate_shared_memory(gl.float32, [TP, TP], SQ), gl.allocate_shared_memory(gl.float32, [TP, TP], SQ),
            gl.allocate_shared_memory(gl.float32, [TP, TP], SQ), gl.allocate_shared_memory(gl.float32, [TP, TP], SQ),
            gl.allocate_shared_memory(gl.float32, [TP, TP], SQ),
        )
        prep_loaded = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        mbarrier.init(prep_loaded.index(0), count=1)
        fence_async_shared()
        if PDL:  # as launch.pdl_enter: the shared-memory setup above overlaps the kernel before this one
            gdc_wait()
            gdc_launch_dependents()
        gl.warp_specialize([
            (_consumer, (bufs0, full0, empty0, kp0, kq0, inv0, p0, vec0, mfull0, mempty0, q_ptr, k_ptr, v_ptr,
                         state_ptr, ring_k_ptr, ring_u_ptr, ring_g_ptr, ring_phase_ptr, pending_ptr, slot_ptr, o_ptr,
                         n_groups, pid, stride, T, Tmax, sq, sk, sv, 0, NT, HK, HV, DK, DV, BKC, BV, TP, STAGES, NB,
                         MAXT, num_warps)),
            (_consumer, (bufs1, full1, empty1, kp1, kq1, inv1, p1, vec1, mfull1, mempty1, q_ptr, k_ptr, v_ptr,
                         state_ptr, ring_k_ptr, ring_u_ptr, ring_g_ptr, ring_phase_ptr, pending_ptr, slot_ptr, o_ptr,
                         n_groups, pid, stride, T, Tmax, sq, sk, sv, 1, NT, HK, HV, DK, DV, BKC, BV, TP, STAGES, NB,
                         MAXT, num_warps)),
            (_state_loader, (desc, bufs0, full0, empty0, prep_loaded, slot_ptr, n_groups, pid, stride, 0, NT, HK, HV,
                             DK, BKC, BV, STAGES, MAXT)),
            (_state_loader, (desc, bufs1, full1, empty1, prep_loaded, slot_ptr, n_groups, pid, stride, 1, NT, HK, HV,
                             DK, BKC, BV, STAGES, MAXT)),
            (_prep_partition, (q_ptr, k_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, inv0, p0, vec0, inv1, p1, vec1,
                               mfull0, mempty0, mfull1, mempty1, kq_prep, inv_bufs, prep_loaded, n_groups, pid, stride,
                               T, scale, eps, sq, sk, sa, sb, HK, DK, TP, NB)),
        ], [num_warps, 1, 1, 2], [REGS, LOADER_REGS, LOADER_REGS, PREP_REGS])  # fmt: skip


def ws_verify(
    q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, state: Tensor,
    ring_k: Tensor, ring_u: Tensor, ring_g: Tensor, ring_phase: Tensor, pending_len: Tensor, slot_ids: Tensor,
    o: Tensor, T: int, strides: tuple[int, int, int, int, int], launch: Launch,
) -> None:  # fmt: skip
    """Launch for inputs ``kernel.replay_verify_kernel`` has checked and laid out as token rows (``strides``: elements
    between consecutive tokens of q, k, v, a, b); writes ``o`` and updates state and ring like the block kernel.
    Only where ``ws_supported``, with a 16-byte aligned state (the TMA descriptor's base)."""
    S, Hv, Dk, Dv = state.shape
    Hk, Tmax = ring_k.shape[-2], ring_k.shape[2]
    layout = gl.NVMMASharedLayout.get_default_for([KEY_CHUNK, BLOCK_V], gl.float32)
    desc = TensorDescriptor.from_tensor(state.view(S * Hv * Dk, Dv), [KEY_CHUNK, BLOCK_V], layout)
    n_groups = slot_ids.numel() * Hk
    programs = min(n_groups, sm_count(v.device))
    # [MAXT] vectors of per-group metadata: one entry per group a CTA walks, plus the one its loads run ahead to.
    maxt = max(2, triton.next_power_of_2(triton.cdiv(n_groups, programs) + 1))
    _ws_verify_kernel[(programs,)](
        desc, q, k, v, a, b, A_log, dt_bias, state, ring_k, ring_u, ring_g, ring_phase, pending_len, slot_ids, o,
        n_groups, T, Tmax, Dk**-0.5, 1e-6, *strides, NT=Dv // BLOCK_V, HK=Hk, HV=Hv, DK=Dk, DV=Dv, BKC=KEY_CHUNK,
        BV=BLOCK_V, TP=TOKENS, STAGES=STAGES, NB=PREP_SLOTS, MAXT=maxt, REGS=CONSUMER_REGS, PREP_REGS=PREP_REGS,
        LOADER_REGS=LOADER_REGS, num_warps=4, **pdl_args(v.device, launch),
    )  # fmt: skip
