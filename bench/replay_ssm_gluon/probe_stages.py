"""Where the verify kernel's time goes: copy-only / fold-only Gluon variants, verify alone, prep alone."""
import json, os, sys, torch, triton
sys.path.insert(0, "bench")
from timing import copy_bandwidth
import replay_ssm as RB
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma
from ocria.plugins.replay_ssm import kernel as K
from ocria.plugins.replay_ssm import wgmma as W


@gluon.jit
def stage_kernel(state_ptr, ring_k_ptr, ring_u_ptr, ring_g_ptr, ring_phase_ptr, pending_ptr, slot_ptr, Tmax,
                 HK: gl.constexpr, HV: gl.constexpr, DK: gl.constexpr, DV: gl.constexpr, BV: gl.constexpr,
                 TP: gl.constexpr, FOLD: gl.constexpr, DIRECT: gl.constexpr):
    acc_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DK, 8])
    a_s: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_s, k_width=1)
    rows: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0])
    cols: gl.constexpr = gl.BlockedLayout([4, 1], [16, 2], [1, 4], [0, 1])
    square: gl.constexpr = gl.BlockedLayout([1, 2], [4, 8], [4, 1], [1, 0])
    kw_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([DK, TP], gl.float32)
    i_v = gl.program_id(0)
    i_h = gl.program_id(1)
    i_b = gl.program_id(2)
    hk = i_h // (HV // HK)
    if DIRECT:
        slot = i_b.to(gl.int64)
        phase = slot * 0
        n = 16
    else:
        slot = gl.load(slot_ptr + i_b).to(gl.int64)
        phase = gl.load(ring_phase_ptr + slot).to(gl.int64)
        n = gl.load(pending_ptr + slot)
    rv_s = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(1, acc_s))
    rk_s = gl.arange(0, DK, layout=gl.SliceLayout(0, acc_s))
    s_offs = ((slot * HV + i_h) * DK + rk_s[None, :]) * DV + rv_s[:, None]
    St = gl.load(state_ptr + s_offs)
    if FOLD:
        tok = (slot * 2 + phase) * Tmax
        ri_q = gl.arange(0, TP, layout=gl.SliceLayout(1, square))
        rj_q = gl.arange(0, TP, layout=gl.SliceLayout(0, square))
        g_i = gl.load(ring_g_ptr + (tok + ri_q) * HV + i_h, mask=ri_q < n, other=0.0)
        after = gl.sum(gl.where(ri_q[:, None] > rj_q[None, :], g_i[:, None], 0.0), 0)
        g_tot = gl.sum(g_i, 0)
        rt_r = gl.arange(0, TP, layout=gl.SliceLayout(1, rows))
        rk_r = gl.arange(0, DK, layout=gl.SliceLayout(0, rows))
        Kp = gl.load(ring_k_ptr + ((tok + rt_r[:, None]) * HK + hk) * DK + rk_r[None, :], mask=(rt_r < n)[:, None], other=0.0)
        Kw = Kp * gl.exp(gl.convert_layout(after, gl.SliceLayout(1, rows)))[:, None]
        kw_smem = gl.allocate_shared_memory(gl.float32, [DK, TP], kw_smem_layout, gl.permute(Kw, (1, 0)))
        rt_c = gl.arange(0, TP, layout=gl.SliceLayout(0, cols))
        rv_c = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(1, cols))
        UpT = gl.load(ring_u_ptr + ((tok + rt_c[None, :]) * HV + i_h) * DV + rv_c[:, None], mask=(rt_c < n)[None, :], other=0.0)
        fence_async_shared()
        St = warpgroup_mma(gl.convert_layout(UpT, a_s), kw_smem.permute((1, 0)), St * gl.exp(g_tot))
    gl.store(state_ptr + s_offs, St)


def main():
    dev = torch.device("cuda")
    Hk, Hv, D = 16, 32, 128
    bw = copy_bandwidth()
    out = dict(bw_GBps=bw / 1e9, rows=[])
    for B in (8, 32, 64):
        T = 16
        gen = torch.Generator(device=dev).manual_seed(B)
        floor_state = B * Hv * D * D * 4 * 2
        reps = max(2, min(256, (1 << 30) // floor_state))
        bufs, _ = RB.make_buffers(reps * B, Hk, Hv, D, D, 16, 1, 4, dev, gen, torch.full((reps * B,), T))
        inp, _ = RB.make_inputs(B, T, Hk, Hv, D, D, 1, torch.bfloat16, dev, gen)
        slot_sets = [torch.randperm(B, device=dev, generator=gen).int() + r * B for r in range(reps)]
        TP = 16
        mats = torch.zeros((B, Hv, 2, TP, TP), device=dev)
        q_scale = torch.ones((B, T, Hk), device=dev)
        o = torch.empty_like(inp["v"])
        grid = (D // 64, Hv, B)
        res = dict(B=B, T=T, state_floor_us=floor_state / bw * 1e6)

        def t(name, fn):
            us, _ = RB._time_us([lambda s=s: fn(s) for s in slot_sets], dev)
            res[name] = us
            print(B, name, round(us, 2), flush=True)

        for fold in (False, True):
            for direct in (False, True):
                for mr in (None, 128):
                    t(f"stage_fold{int(fold)}_direct{int(direct)}_mr{mr}", lambda s, fold=fold, direct=direct, mr=mr: stage_kernel[grid](
                        bufs["state"], bufs["ring_k"], bufs["ring_u"], bufs["ring_g"], bufs["ring_phase"], bufs["pending_len"], s, 16,
                        HK=Hk, HV=Hv, DK=D, DV=D, BV=64, TP=TP, FOLD=fold, DIRECT=direct, num_warps=4, **({"maxnreg": mr} if mr else {})))
        q, v = inp["q"], inp["v"]
        for mr in (None, 168):
            t(f"wgmma_verify_alone_mr{mr}", lambda s, mr=mr: W._replay_verify_wgmma_kernel[grid](
                q, v, bufs["state"], bufs["ring_k"], bufs["ring_u"], bufs["ring_g"], bufs["ring_phase"], bufs["pending_len"], s,
                mats, q_scale, o, T, 16, Hk * D, Hv * D, HK=Hk, HV=Hv, DK=D, DV=D, BV=64, TP=TP, PDL=False, OVERLAP=False,
                num_warps=4, **({"maxnreg": mr} if mr else {})))
        t("prep_alone", lambda s: K._chunk_prep_kernel[(Hv, B)](
            q, inp["k"], inp["a"], inp["b"], inp["A_log"], inp["dt_bias"], bufs["ring_k"], bufs["ring_g"], bufs["ring_phase"], s,
            mats, q_scale, T, 16, D**-0.5, 1e-6, Hk * D, Hk * D, Hv, Hv, HK=Hk, HV=Hv, DK=D, BK=D, TP=TP, PREC="tf32",
            num_warps=K.PREP_WARPS, OVERLAP=False, PDL=False, launch_pdl=False))
        for wg in (True, False):
            K.WGMMA_VERIFY = wg
            t(f"replay_verify_wgmma{int(wg)}", lambda s: K.replay_verify_kernel(**inp, **bufs, slot_ids=s))
        K.WGMMA_VERIFY = True
        out["rows"].append(res)
        torch.cuda.empty_cache()
    json.dump(out, open(os.environ.get("OUT", ".") + "/probe_stages.json", "w"), indent=1)


if __name__ == "__main__":
    main()
