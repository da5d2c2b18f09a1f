import json, sys, traceback, torch
sys.path.insert(0, "bench")
from timing import copy_bandwidth
import replay_ssm as RB
from ocria.plugins.replay_ssm import kernel as K
dev = torch.device("cuda")
heads = (16, 32, 128)
out = {}
for wg in (True, False):
    K.WGMMA_VERIFY = wg
    try:
        out[f"correct_wgmma_{wg}"] = RB.check_correctness(heads, dev, {})
        out[f"launch_wgmma_{wg}"] = {f"{B}x{T}": RB.check_launch(B, T, heads, dev, [(64, 4), (64, 4, 168)]) for B in (5, 33) for T in (16, 9, 2)}
    except Exception:
        out[f"error_{wg}"] = traceback.format_exc()[-3000:]
    print(json.dumps({k: v for k, v in out.items() if str(wg) in k}, indent=0)[:4000], flush=True)
bw = copy_bandwidth()
rows = []
for B in (8, 32, 64):
    for T in (16, 8):
        for wg in (True, False):
            K.WGMMA_VERIFY = wg
            for cfg in ({}, dict(block_v=64, num_warps=4), dict(block_v=64, num_warps=4, max_registers=168), dict(block_v=64, num_warps=4, max_registers=128)):
                if not wg and cfg.get("max_registers") == 128: continue
                try:
                    r = RB.bench_row(B, T, heads, torch.bfloat16, dev, bw, cfg, None, 1 << 30, baselines=False)
                    rows.append(dict(B=B, T=T, wgmma=wg, cfg=cfg, us=r["ours_us"], floor=r["floor_us"], x=r["ours_us"] / r["floor_us"]))
                except Exception as e:
                    rows.append(dict(B=B, T=T, wgmma=wg, cfg=cfg, error=str(e)[:300]))
                print(rows[-1], flush=True)
out["rows"] = rows; out["bw_GBps"] = bw / 1e9
import os
json.dump(out, open(os.environ.get("OUT", ".") + "/probe_wgmma.json", "w"), indent=1)
