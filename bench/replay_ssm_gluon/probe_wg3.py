import json, os, sys, torch
sys.path.insert(0, "bench")
from timing import copy_bandwidth
import replay_ssm as RB
from ocria.plugins.replay_ssm import kernel as K
dev = torch.device("cuda")
heads = (16, 32, 128)
out = {}
for pers in (2, 1):
    for ov in (True, False):
        K.OVERLAP_PREP, K.WGMMA_PERSISTENT = ov, pers
        key = f"launch_pers{pers}_overlap{ov}"
        try:
            out[key] = {f"{B}x{T}": RB.check_launch(B, T, heads, dev, [(64, 4)]) for B in (5, 33) for T in (16, 9, 2)}
            print(key, {k: v["64x4"] for k, v in out[key].items()}, flush=True)
        except Exception as e:
            print(key, "ERROR", repr(e)[:500], flush=True); out[key] = repr(e)[:500]
bw = copy_bandwidth()
rows = []
tag = sys.argv[1] if len(sys.argv) > 1 else "x"
for B in (8, 32, 64):
    for T in (16,):
        for wg, pers, ov in ((True, 2, True), (True, 1, True), (True, 2, False), (True, 0, True), (False, 0, True)):
            K.WGMMA_VERIFY, K.WGMMA_PERSISTENT, K.OVERLAP_PREP = wg, pers, ov
            for cfg in ({},):
                try:
                    r = RB.bench_row(B, T, heads, torch.bfloat16, dev, bw, cfg, None, 1 << 30, baselines=False)
                    rows.append(dict(B=B, T=T, wgmma=wg, persistent=pers, overlap=ov, cfg=cfg, us=r["ours_us"], floor=r["floor_us"], x=r["ours_us"] / r["floor_us"]))
                except Exception as e:
                    rows.append(dict(B=B, T=T, wgmma=wg, persistent=pers, overlap=ov, error=repr(e)[:300]))
                print(tag, rows[-1], flush=True)
out["rows"] = rows; out["bw_GBps"] = bw / 1e9
json.dump(out, open(os.environ.get("OUT", ".") + f"/probe_wg3_{tag}.json", "w"), indent=1)
