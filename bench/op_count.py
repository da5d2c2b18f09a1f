"""Ops one decode step dispatches, counted on CPU: a proxy for its GPU kernel launches.

Each leaf ATen op that computes (views, allocations and metadata are skipped) and each ``ocria::``
plugin call counts once; plugin kernels run in Triton's interpreter, so their insides are not
counted. CPU ATen decomposes a few ops that CUDA runs as one kernel (``rms_norm`` among them), so
this overstates what eager norms cost on the GPU; the GPU profile of ``ocria bench engine --profile`` is the
measurement, this is for comparing code versions on a machine without a GPU.

    python bench/op_count.py --plugins on --mode spec --out bench/results/op_count_cpu.json
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse  # noqa: E402
import collections  # noqa: E402
import datetime as dt  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from inert_ops import INERT_OPS  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from ocria.builder.presets import load_preset, random_models  # noqa: E402
from ocria.data import generate  # noqa: E402
from ocria.models import DrafterCache, TargetCache  # noqa: E402
from ocria.runtime.decode import SamplingTensors, decode_step, prefill  # noqa: E402
from ocria.runtime.processor import Processor  # noqa: E402

INERT = {f"aten::{name}" for name in INERT_OPS}  # ops that launch nothing on a GPU


def _inert(event) -> bool:
    if event.name.startswith("ocria::"):
        return False
    kids = [c for c in event.cpu_children if c.name.startswith(("aten::", "ocria::"))]
    return event.name in INERT and all(_inert(c) for c in kids)


def count_ops(events) -> collections.Counter:
    counts = collections.Counter()

    def walk(e):
        if e.name.startswith("ocria::"):
            counts[e.name] += 1
            return
        kids = [c for c in e.cpu_children if c.name.startswith(("aten::", "ocria::")) and not _inert(c)]
        if e.name.startswith("aten::") and not kids:
            if e.name not in INERT:
                counts[e.name] += 1
            return
        for c in e.cpu_children:
            walk(c)

    for e in events:
        if e.cpu_parent is None:
            walk(e)
    return counts


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="ocria-mini")
    ap.add_argument("--plugins", choices=("on", "off"), default="on")
    ap.add_argument("--mode", choices=("ar", "spec"), default="ar")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    preset = load_preset(args.preset)
    target, drafter = random_models(preset, "cpu", torch.bfloat16)
    target.text.fuse_projections()
    drafter.fuse_projections()
    target.set_plugins(args.plugins == "on")
    drafter.set_plugins(args.plugins == "on")
    buf = io.BytesIO()
    generate(7, kind="line").image.save(buf, format="PNG")
    prompt = Processor(preset.assets).prepare(buf.getvalue())
    L, block = prompt.input_ids.numel(), drafter.config.block_size
    spec = args.mode == "spec"
    tcache = TargetCache.allocate(target.text_config, 1, L + 4 * block, block, torch.bfloat16)
    dc = drafter.config
    dcache = DrafterCache.allocate(dc.num_hidden_layers, dc.num_key_value_heads, dc.head_dim, 1, L + 4 * block,
                                   torch.bfloat16) if spec else None
    use = drafter if spec else None
    first = int(prefill(target, use, tcache, dcache, 0, prompt).argmax(-1))
    slot, last = torch.zeros(1, dtype=torch.long), torch.tensor([first])
    params = SamplingTensors(torch.zeros(1), torch.ones(1), torch.zeros(1, dtype=torch.long),
                             torch.zeros(1, dtype=torch.long))
    decode_step(target, use, tcache, dcache, slot, last, params, L + 2 * block, True)  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        decode_step(target, use, tcache, dcache, slot, last, params, L + 2 * block, True)
    counts = count_ops(prof.events())
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = None
    result = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "device": "cpu (proxy)",
              "command": " ".join(["python", *sys.argv]), "git": commit, "preset": args.preset,
              "plugins": args.plugins, "mode": args.mode, "layers": len(target.text.layers),
              "ops_per_step": sum(counts.values()), "by_op": dict(counts.most_common())}
    print(f"{args.preset} {args.mode} plugins {args.plugins}: {result['ops_per_step']} ops per decode step")
    for name, n in counts.most_common(12):
        print(f"  {n:5d}  {name}")
    if args.out:  # appended: one file holds the runs of several code versions and modes
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        runs = json.loads(out.read_text()) if out.is_file() else []
        out.write_text(json.dumps([*runs, result], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
