"""Diagnostic: logit difference between the ar path (T=1 steps) and the verify path (one T=16 step)
on the same teacher-forced tokens, fp32 and bf16, ReplaySSM Triton kernels on and off.

    python bench/path_noise.py --out bench/results/path_noise_h200.json
"""

import argparse
import datetime as dt
import io
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from e2e import path_noise  # noqa: E402

from ocria.builder.presets import load_preset, random_models  # noqa: E402
from ocria.data import LONG_PAGE, generate  # noqa: E402
from ocria.runtime.processor import Processor  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="ocria-1-sim")
    ap.add_argument("--out", default="bench/results/path_noise_h200.json")
    args = ap.parse_args()
    preset = load_preset(args.preset)
    buf = io.BytesIO()
    generate(7, kind="page", config=LONG_PAGE).image.save(buf, format="PNG")
    prompt = Processor(preset.assets).prepare(buf.getvalue())
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        target, drafter = random_models(preset, "cuda", dtype)
        for plugins in (True, False):
            target.set_plugins(plugins)
            noise = path_noise(target, prompt, [1 + i for i in range(16)], drafter.config.block_size)
            rows.append({"dtype": str(dtype), "plugins": plugins, "max_abs_logit_diff": noise})
            print(rows[-1], flush=True)
        del target, drafter
        torch.cuda.empty_cache()
    out = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "gpu": torch.cuda.get_device_name(),
           "command": " ".join(["python", *sys.argv]), "rows": rows}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
