"""The state stream alone in the verify kernel's tiling: Triton blocked copy vs Gluon accumulator-layout copy."""
import json, os, sys, torch, triton, triton.language as tl
sys.path.insert(0, "bench"); sys.path.insert(0, "bench/replay_ssm_gluon")
from timing import copy_bandwidth
import replay_ssm as RB
import probe_stages as PS


@triton.jit
def tl_copy(state_ptr, slot_ptr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr):
    i_v, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(slot_ptr + i_b).to(tl.int64)
    rk = tl.arange(0, DK)
    rv = i_v * BV + tl.arange(0, BV)
    p = state_ptr + ((slot * HV + i_h) * DK + rk[None, :]) * DV + rv[:, None]
    tl.store(p, tl.load(p))


def main():
    dev = torch.device("cuda")
    Hk, Hv, D = 16, 32, 128
    bw = copy_bandwidth()
    out = dict(bw_GBps=bw / 1e9, rows=[])
    for B in (8, 32, 64):
        gen = torch.Generator(device=dev).manual_seed(B)
        state_bytes = B * Hv * D * D * 4 * 2
        reps = max(2, min(256, (1 << 30) // state_bytes))
        bufs, _ = RB.make_buffers(reps * B, Hk, Hv, D, D, 16, 1, 4, dev, gen, torch.full((reps * B,), 16))
        slot_sets = [torch.randperm(B, device=dev, generator=gen).int() + r * B for r in range(reps)]
        res = dict(B=B, state_floor_us=state_bytes / bw * 1e6)
        for bv, w in ((64, 4), (32, 4), (64, 8), (128, 8)):
            us, _ = RB._time_us([lambda s=s: tl_copy[(D // bv, Hv, B)](bufs["state"], s, HV=Hv, DK=D, DV=D, BV=bv, num_warps=w) for s in slot_sets], dev)
            res[f"triton_blocked_{bv}x{w}"] = us
        us, _ = RB._time_us([lambda s=s: PS.stage_kernel[(D // 64, Hv, B)](bufs["state"], bufs["ring_k"], bufs["ring_u"], bufs["ring_g"], bufs["ring_phase"], bufs["pending_len"], s, 16, HK=Hk, HV=Hv, DK=D, DV=D, BV=64, TP=16, FOLD=False, DIRECT=False, num_warps=4) for s in slot_sets], dev)
        res["gluon_acc_64x4"] = us
        print(res, flush=True)
        out["rows"].append(res)
    json.dump(out, open(os.environ.get("OUT", ".") + "/probe_copy.json", "w"), indent=1)


main()
