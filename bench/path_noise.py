"""Diagnostic: logit difference between the ar path (T=1 steps) and the verify path (one T=16 step)
on the same teacher-forced tokens, fp32 and bf16, ReplaySSM Triton kernels on and off.

    python bench/path_noise.py --out bench/results/path_noise_h200.json

With ``--engine``: that engine's target (any recipe) on held-out documents, over 16-token windows covering
its whole greedy answer (the prompt and the answer before the window prefilled): the noise scale that
``python -m ocria.train eval``'s logit gaps at spec/ar divergences are to be read against.

    python bench/path_noise.py --engine engines/ocria-mini-mixed --device cpu --docs 92 368 --out ...
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


def engine_noise(engine_dir: str, device: str, docs: list[int]) -> list[dict]:
    """Per held-out document: the largest ar-vs-verify logit difference over block-wide windows that cover its
    whole answer (the last one ends at the answer's end)."""
    from ocria.runtime.engine import Engine
    from ocria.runtime.processor import PreparedPrompt
    from ocria.train.evaluate import heldout_pngs, transcribe

    engine = Engine(engine_dir, device=device)
    block = engine.block_size
    rows = []
    for doc in docs:
        image = heldout_pngs(1, start=doc)[0][0]
        answer = transcribe(engine, [image], "ar", 384, 1)[0]["tokens"]
        if not answer:
            raise SystemExit(f"held-out document {doc}: the engine's answer is empty, nothing to compare")
        prompt = engine.processor.prepare(image)
        width = min(block, len(answer))
        starts = list(range(0, len(answer) - width + 1, width))
        if starts[-1] + width < len(answer):
            starts.append(len(answer) - width)  # the tail, overlapping the window before it
        noise = 0.0
        for start in starts:
            prefix = torch.cat([prompt.input_ids, torch.tensor(answer[:start], dtype=torch.long)])
            window = PreparedPrompt(prefix, prompt.pixel_values, prompt.image_grid_thw)
            noise = max(noise, path_noise(engine.target, window, answer[start:start + width], width))
        rows.append({"doc": doc, "answer_tokens": len(answer), "max_abs_logit_diff": noise})
        print(rows[-1], flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="ocria-1-sim")
    ap.add_argument("--engine", help="measure this engine's target on held-out documents instead")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--docs", type=int, nargs="+", default=[0], help="held-out document indices (with --engine)")
    ap.add_argument("--out", default="bench/results/path_noise_h200.json")
    args = ap.parse_args()
    if args.engine:
        rows = engine_noise(args.engine, args.device, args.docs)
        out = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "device": args.device,
               "engine": args.engine, "command": " ".join(["python", *sys.argv]), "rows": rows}
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
        return 0
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
