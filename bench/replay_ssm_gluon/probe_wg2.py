import json, os, sys, torch
sys.path.insert(0, "bench")
from timing import copy_bandwidth
import replay_ssm as RB
from ocria.plugins.replay_ssm import kernel as K
dev = torch.device("cuda")
heads = (16, 32, 128)
out = {}
for ov in (True, False):
    K.OVERLAP_PREP = ov
    out[f"launch_overlap{ov}"] = {f"{B}x{T}": RB.check_launch(B, T, heads, dev, [(64, 4), (64, 4, 168)]) for B in (5, 33) for T in (16, 9, 2)}
    print(ov, {k: v["64x4"] for k, v in out[f"launch_overlap{ov}"].items()}, flush=True)
bw = copy_bandwidth()
rows = []
tag = sys.argv[1] if len(sys.argv) > 1 else "x"
for B in (8, 32, 64):
    for T in (16,):
        for wg, ov in ((True, True), (True, False), (False, True)):
            K.WGMMA_VERIFY, K.OVERLAP_PREP = wg, ov
            for cfg in ({}, dict(block_v=64, num_warps=4), dict(block_v=64, num_warps=4, max_registers=168)):
                r = RB.bench_row(B, T, heads, torch.bfloat16, dev, bw, cfg, None, 1 << 30, baselines=False)
                rows.append(dict(B=B, T=T, wgmma=wg, overlap=ov, cfg=cfg, us=r["ours_us"], floor=r["floor_us"], x=r["ours_us"] / r["floor_us"]))
                print(tag, rows[-1], flush=True)
out["rows"] = rows; out["bw_GBps"] = bw / 1e9
json.dump(out, open(os.environ.get("OUT", ".") + f"/probe_wg2_{tag}.json", "w"), indent=1)
