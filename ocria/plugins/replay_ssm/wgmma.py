"""The T > 1 verify kernel for Hopper in Gluon: the state tile never changes layout.

Same work and effects as ``_replay_verify_kernel``'s chunk path (see kernel.py for the WY form), written with
explicit layouts. Triton loads the [BV, Dk] fp32 state tile in a blocked layout and converts it to the wgmma
accumulator layout for the fold and back for the store: two 32 KB round trips through shared memory per program,
which ncu showed as the verify kernel's limit (L1/shared at 75% of peak, bench/results/replay_ssm_notes.md). Here
the tile is loaded from global memory straight into the accumulator layout (each warp instruction still covers
whole 32-byte sectors), folded by one wgmma, stored from the same registers, and written once to shared memory,
where it is the A operand of the [K; Q] product. Only the small [BV, T] tiles change layout.

tf32 products only (bf16 / fp16 inputs); fp32 inputs keep the Triton kernel's tf32x3.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import async_copy, fence_async_shared, warpgroup_mma

NUM_WARPS = 4  # one warpgroup: the wgmma M = 64 rows of the state tile


@gluon.jit
def _pdl_wait():
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _pdl_release():
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False,
                              pack=1)  # fmt: skip


@gluon.jit
def _prep_loads(ring_k_ptr, ring_g_ptr, q_scale_ptr, base, park, row_r, hk, i_h, T, HK: gl.constexpr,
                HV: gl.constexpr, DK: gl.constexpr, TP: gl.constexpr):
    """What ``_chunk_prep_kernel`` wrote for this chunk, all loads at once: the parked normalised keys [TP, DK],
    the query scales [TP], the log-decays [TP] and the matrices (I + A)^-1 diag(beta) and P [TP, TP]."""
    rt_r = gl.arange(0, TP, layout=gl.SliceLayout(1, ROWS))
    rk_r = gl.arange(0, DK, layout=gl.SliceLayout(0, ROWS))
    ri_q = gl.arange(0, TP, layout=gl.SliceLayout(1, SQUARE))
    rj_q = gl.arange(0, TP, layout=gl.SliceLayout(0, SQUARE))
    Kn = gl.load(ring_k_ptr + ((park + rt_r[:, None]) * HK + hk) * DK + rk_r[None, :], mask=(rt_r < T)[:, None],
                 other=0.0)  # fmt: skip
    q_scale = gl.load(q_scale_ptr + row_r * HK + hk, mask=rt_r < T, other=0.0)
    g_new = gl.load(ring_g_ptr + (park + ri_q) * HV + i_h, mask=ri_q < T, other=0.0)
    mat = ri_q[:, None] * TP + rj_q[None, :]
    return Kn, q_scale, g_new, gl.load(base + mat), gl.load(base + TP * TP + mat)


@gluon.constexpr_function
def _acc(n):
    """wgmma accumulator layout of a [64, n] tile over one warpgroup (tf32: k = 8)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 8])


# Blocked layouts: token rows [TP, DK] coalesced along DK, ring columns [BV, TP] coalesced along BV, [TP, TP] matrices.
ROWS = gl.constexpr(gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[1, 32], warps_per_cta=[4, 1],
                                     order=[1, 0]))  # fmt: skip
COLS = gl.constexpr(gl.BlockedLayout(size_per_thread=[4, 1], threads_per_warp=[16, 2], warps_per_cta=[1, 4],
                                     order=[0, 1]))  # fmt: skip
SQUARE = gl.constexpr(gl.BlockedLayout(size_per_thread=[1, 2], threads_per_warp=[4, 8], warps_per_cta=[4, 1],
                                       order=[1, 0]))  # fmt: skip


@gluon.jit
def _verify_tile(
    St, slot, phase, n, i_v, i_h, i_b, q_ptr, v_ptr, state_ptr, ring_k_ptr, ring_u_ptr, ring_g_ptr, mats_ptr,
    q_scale_ptr, o_ptr, T, Tmax, sq, sv,
    HK: gl.constexpr, HV: gl.constexpr, DK: gl.constexpr, DV: gl.constexpr, BV: gl.constexpr, TP: gl.constexpr,
    OVERLAP: gl.constexpr,
):  # fmt: skip
    """One state tile St [BV, DK] (in the accumulator layout, as read): fold the slot's n pending tokens, write the
    tile back, verify the T new tokens from it and park their writes."""
    acc_s: gl.constexpr = _acc(DK)
    acc_xy: gl.constexpr = _acc(2 * TP)
    acc_t: gl.constexpr = _acc(TP)
    a_s: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_s, k_width=1)
    a_t: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_t, k_width=1)
    # Shared layouts: B operands of tf32 wgmma must be K-major, so each is stored [N, K] and passed transposed.
    s_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BV, DK], gl.float32)
    kw_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([DK, TP], gl.float32)
    kq_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([2 * TP, DK], gl.float32)
    tt_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([TP, TP], gl.float32)
    hk = i_h // (HV // HK)

    # Every load that does not wait for the prep kernel goes out first: the pending tokens' ring entries and the new
    # tokens' q and v. A tile is a chain of dependent memory round trips; each one cut is latency saved.
    tok = (slot * 2 + phase) * Tmax
    ri_q = gl.arange(0, TP, layout=gl.SliceLayout(1, SQUARE))
    rj_q = gl.arange(0, TP, layout=gl.SliceLayout(0, SQUARE))
    g_i = gl.load(ring_g_ptr + (tok + ri_q) * HV + i_h, mask=ri_q < n, other=0.0)
    rt_r = gl.arange(0, TP, layout=gl.SliceLayout(1, ROWS))
    rk_r = gl.arange(0, DK, layout=gl.SliceLayout(0, ROWS))
    Kp = gl.load(ring_k_ptr + ((tok + rt_r[:, None]) * HK + hk) * DK + rk_r[None, :], mask=(rt_r < n)[:, None],
                 other=0.0)  # fmt: skip
    rt_c = gl.arange(0, TP, layout=gl.SliceLayout(0, COLS))
    rv_c = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(1, COLS))
    UpT = gl.load(ring_u_ptr + ((tok + rt_c[None, :]) * HV + i_h) * DV + rv_c[:, None], mask=(rt_c < n)[None, :],
                  other=0.0)  # fmt: skip
    mt_r = rt_r < T
    row_r = (i_b * T + rt_r).to(gl.int64)
    Q = gl.load(q_ptr + row_r[:, None] * sq + hk * DK + rk_r[None, :], mask=mt_r[:, None], other=0.0)
    rt_t = gl.arange(0, TP, layout=gl.SliceLayout(0, acc_t))
    rv_t = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(1, acc_t))
    mt_t = (rt_t < T)[None, :]
    row_t = (i_b * T + rt_t).to(gl.int64)
    VT = gl.load(v_ptr + row_t[None, :] * sv + i_h * DV + rv_t[:, None], mask=mt_t, other=0.0)
    park = (slot * 2 + 1 - phase) * Tmax
    base = mats_ptr + (i_b * HV + i_h).to(gl.int64) * 2 * TP * TP
    if not OVERLAP:
        Kn, q_scale, g_new, inv, P = _prep_loads(ring_k_ptr, ring_g_ptr, q_scale_ptr, base, park, row_r, hk, i_h, T,
                                                 HK, HV, DK, TP)  # fmt: skip

    # Fold the n pending tokens (ring half `phase`): St = exp(g_tot) St + U^T (K * exp(g_tot - G)), one wgmma.
    after = gl.sum(gl.where(ri_q[:, None] > rj_q[None, :], g_i[:, None], 0.0), 0)  # sum over pending i > j
    Kw = Kp * gl.exp(gl.convert_layout(after, gl.SliceLayout(1, ROWS)))[:, None]
    kw_smem = gl.allocate_shared_memory(gl.float32, [DK, TP], kw_smem_layout, gl.permute(Kw, (1, 0)))
    fence_async_shared()
    St = warpgroup_mma(gl.convert_layout(UpT, a_s), kw_smem.permute((1, 0)), St * gl.exp(gl.sum(g_i, 0)))
    if n > 0:  # with nothing pending the state is unchanged: no write
        rv_s = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(1, acc_s))
        rk_s = gl.arange(0, DK, layout=gl.SliceLayout(0, acc_s))
        gl.store(state_ptr + ((slot * HV + i_h) * DK + rk_s[None, :]) * DV + rv_s[:, None], St)
    s_smem = gl.allocate_shared_memory(gl.float32, [BV, DK], s_smem_layout, St)
    if OVERLAP:  # launched beside _chunk_prep_kernel: what the fold read was written before it; what follows it wrote
        _pdl_wait()
        _pdl_release()
        Kn, q_scale, g_new, inv, P = _prep_loads(ring_k_ptr, ring_g_ptr, q_scale_ptr, base, park, row_r, hk, i_h, T,
                                                 HK, HV, DK, TP)  # fmt: skip

    # The T new tokens: [K; Q] rows into shared memory, X^T | Y^T = St [K; Q]^T in one wgmma.
    kq_smem = gl.allocate_shared_memory(gl.float32, [2 * TP, DK], kq_smem_layout)
    kq_smem.slice(0, TP).store(Kn)
    kq_smem.slice(TP, TP).store(Q.to(gl.float32) * q_scale[:, None])
    fence_async_shared()
    XY = warpgroup_mma(s_smem, kq_smem.permute((1, 0)), gl.zeros([BV, 2 * TP], gl.float32, acc_xy), use_acc=False)
    XT, YT = gl.split(gl.permute(gl.reshape(XY, [BV, 2, TP]), (0, 2, 1)))
    XT = gl.convert_layout(XT, acc_t)
    YT = gl.convert_layout(YT, acc_t)

    # U^T = (V^T - exp(G) X^T) (inv diag(beta))^T and O^T = U^T P^T + exp(G) Y^T, with the prep kernel's matrices.
    upto = gl.sum(gl.where(ri_q[:, None] <= rj_q[None, :], g_new[:, None], 0.0), 0)  # G_j = sum over i <= j
    decay = gl.exp(gl.convert_layout(upto, gl.SliceLayout(0, acc_t)))
    inv_smem = gl.allocate_shared_memory(gl.float32, [TP, TP], tt_smem_layout, inv)
    p_smem = gl.allocate_shared_memory(gl.float32, [TP, TP], tt_smem_layout, P)
    W = VT.to(gl.float32) - decay[None, :] * XT
    fence_async_shared()
    UT = warpgroup_mma(gl.convert_layout(W, a_t), inv_smem.permute((1, 0)), gl.zeros([BV, TP], gl.float32, acc_t),
                       use_acc=False)  # fmt: skip
    OT = warpgroup_mma(gl.convert_layout(UT, a_t), p_smem.permute((1, 0)), decay[None, :] * YT)
    gl.store(o_ptr + (row_t[None, :] * HV + i_h) * DV + rv_t[:, None], OT.to(o_ptr.dtype.element_ty), mask=mt_t)
    # Park the new tokens' writes in ring half 1 - phase (their k and g are parked by the prep kernel).
    gl.store(ring_u_ptr + ((park + rt_t[None, :]) * HV + i_h) * DV + rv_t[:, None], UT, mask=mt_t)


@gluon.jit
def _replay_verify_wgmma_kernel(
    q_ptr, v_ptr,
    state_ptr, ring_k_ptr, ring_u_ptr, ring_g_ptr, ring_phase_ptr, pending_ptr, slot_ptr,
    mats_ptr, q_scale_ptr, o_ptr, T, Tmax, sq, sv,
    HK: gl.constexpr, HV: gl.constexpr, DK: gl.constexpr, DV: gl.constexpr,
    BV: gl.constexpr, TP: gl.constexpr, PDL: gl.constexpr, OVERLAP: gl.constexpr,
):  # fmt: skip
    """One program per (column tile, value head, batch row); the state tile loaded straight into registers."""
    if PDL and not OVERLAP:
        _pdl_wait()
        _pdl_release()
    acc_s: gl.constexpr = _acc(DK)
    i_v = gl.program_id(0)
    i_h = gl.program_id(1)
    i_b = gl.program_id(2)
    slot = gl.load(slot_ptr + i_b).to(gl.int64)
    phase = gl.load(ring_phase_ptr + slot).to(gl.int64)
    n = gl.load(pending_ptr + slot)
    rv_s = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(1, acc_s))
    rk_s = gl.arange(0, DK, layout=gl.SliceLayout(0, acc_s))
    St = gl.load(state_ptr + ((slot * HV + i_h) * DK + rk_s[None, :]) * DV + rv_s[:, None])
    _verify_tile(St, slot, phase, n, i_v, i_h, i_b, q_ptr, v_ptr, state_ptr, ring_k_ptr, ring_u_ptr, ring_g_ptr,
                 mats_ptr, q_scale_ptr, o_ptr, T, Tmax, sq, sv, HK, HV, DK, DV, BV, TP, OVERLAP)  # fmt: skip


@gluon.jit
def _tile_coords(t, NV: gl.constexpr, HV: gl.constexpr):
    """(column tile, value head, batch row) of flat tile index t (column tiles fastest, as the 3-D grid)."""
    return t % NV, (t // NV) % HV, t // (NV * HV)


@gluon.jit
def _stage_state(staging, state_ptr, slot, i_h, i_v, live, HV: gl.constexpr, DK: gl.constexpr, DV: gl.constexpr,
                 BV: gl.constexpr):  # fmt: skip
    """Start copying state tile [DK, BV] of (slot, head i_h, columns i_v) into ``staging`` (cp.async, 16 bytes per
    thread and row; nothing when not ``live``)."""
    copy: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[2, 16], warps_per_cta=[4, 1],
                                          order=[1, 0])  # fmt: skip
    rk = gl.arange(0, DK, layout=gl.SliceLayout(1, copy))
    rv = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(0, copy))
    ptrs = state_ptr + ((slot * HV + i_h) * DK + rk[:, None]) * DV + rv[None, :]
    async_copy.async_copy_global_to_shared(staging, ptrs, mask=(rk < live * DK)[:, None])
    async_copy.commit_group()


@gluon.jit
def _replay_verify_persistent_kernel(
    q_ptr, v_ptr,
    state_ptr, ring_k_ptr, ring_u_ptr, ring_g_ptr, ring_phase_ptr, pending_ptr, slot_ptr,
    mats_ptr, q_scale_ptr, o_ptr, B, T, Tmax, sq, sv,
    HK: gl.constexpr, HV: gl.constexpr, DK: gl.constexpr, DV: gl.constexpr,
    BV: gl.constexpr, TP: gl.constexpr, PDL: gl.constexpr, OVERLAP: gl.constexpr,
):  # fmt: skip
    """A fixed grid walking the tiles: while a tile is folded and verified, the next tile's state is already on its
    way into shared memory (cp.async), so the state stream does not stop for each tile's latency chain."""
    if PDL and not OVERLAP:
        _pdl_wait()
        _pdl_release()
    acc_s: gl.constexpr = _acc(DK)
    NV: gl.constexpr = DV // BV
    # 16-byte vectors swizzled by row: the accumulator layout's reads (8 columns x 4 rows 2 apart per warp
    # instruction) hit 32 distinct banks.
    staging_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0])
    staging = gl.allocate_shared_memory(gl.float32, [DK, BV], staging_layout)
    n_tiles = NV * HV * B
    step = gl.num_programs(0)
    t = gl.program_id(0)
    i_v, i_h, i_b = _tile_coords(t, NV, HV)
    slot = gl.load(slot_ptr + i_b).to(gl.int64)
    _stage_state(staging, state_ptr, slot, i_h, i_v, 1, HV, DK, DV, BV)
    phase = gl.load(ring_phase_ptr + slot).to(gl.int64)
    n = gl.load(pending_ptr + slot)
    _, _, b_next = _tile_coords(gl.minimum(t + step, n_tiles - 1), NV, HV)
    slot_next = gl.load(slot_ptr + b_next).to(gl.int64)
    while t < n_tiles:
        async_copy.wait_group(0)
        gl.thread_barrier()
        St = staging.permute((1, 0)).load(acc_s)
        gl.thread_barrier()  # every warp has its part of the tile before the next copy overwrites it
        t_next = t + step
        v_next, h_next, _ = _tile_coords(t_next, NV, HV)
        _stage_state(staging, state_ptr, slot_next, h_next, v_next, (t_next < n_tiles).to(gl.int32), HV, DK, DV, BV)
        phase_next = gl.load(ring_phase_ptr + slot_next).to(gl.int64)
        n_next = gl.load(pending_ptr + slot_next)
        _, _, b_after = _tile_coords(gl.minimum(t_next + step, n_tiles - 1), NV, HV)
        slot_after = gl.load(slot_ptr + b_after).to(gl.int64)
        _verify_tile(St, slot, phase, n, i_v, i_h, i_b, q_ptr, v_ptr, state_ptr, ring_k_ptr, ring_u_ptr, ring_g_ptr,
                     mats_ptr, q_scale_ptr, o_ptr, T, Tmax, sq, sv, HK, HV, DK, DV, BV, TP, OVERLAP)  # fmt: skip
        t = t_next
        i_v, i_h, i_b = _tile_coords(t, NV, HV)
        slot, phase, n = slot_next, phase_next, n_next
        slot_next = slot_after
