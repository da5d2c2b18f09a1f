"""Ops one decode step dispatches, counted on CPU: a proxy for its GPU kernel launches.

Each leaf ATen op that computes (views, allocations and metadata are skipped: ``INERT_OPS``) and each ``ocria::``
plugin call counts once; plugin kernels run in Triton's interpreter, so their insides are not counted. CPU ATen
decomposes a few ops that CUDA runs as one kernel (``rms_norm`` among them), so this overstates what eager norms
cost on the GPU; the GPU profile of ``ocria bench engine --profile`` is the measurement, this is for comparing code
versions on a machine without a GPU. With ``--out`` the run is appended to the file's list of runs.

    python -m bench.op_count --plugins on --mode spec --out /tmp/op_count.json
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse  # noqa: E402
import collections  # noqa: E402
import datetime as dt  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from ocria.bench.results import result_header, write_json  # noqa: E402
from ocria.builder.presets import load_preset, random_models  # noqa: E402
from ocria.data import generate  # noqa: E402
from ocria.models import DrafterCache, TargetCache  # noqa: E402
from ocria.plugins.policy import ExecutionPolicy  # noqa: E402
from ocria.runtime.decode import SamplingTensors, decode_step, prefill  # noqa: E402
from ocria.runtime.processor import Processor  # noqa: E402

# ATen ops that launch no GPU kernel (views, allocations, metadata, scalar reads), by name without ``aten::``.
INERT_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "view", "view_as", "_unsafe_view", "reshape", "_reshape_alias",
    "as_strided", "resize_", "set_", "t", "transpose", "permute", "unsqueeze", "squeeze", "expand", "slice",
    "select", "split", "split_with_sizes", "chunk", "unbind", "narrow", "unflatten", "flatten", "diagonal",
    "view_as_real", "alias", "detach", "lift", "lift_fresh", "contiguous", "type_as", "resolve_conj",
    "promote_types", "result_type", "scalar_tensor", "is_same_size", "size", "stride", "item",
    "_local_scalar_dense", "is_nonzero",
})
INERT = {f"aten::{name}" for name in INERT_OPS}


def _inert(event) -> bool:
    if event.name.startswith("ocria::"):
        return False
    kids = [c for c in event.cpu_children if c.name.startswith(("aten::", "ocria::"))]
    return event.name in INERT and all(_inert(c) for c in kids)


def count_ops(events) -> collections.Counter:
    """Leaf computing ATen ops and ``ocria::`` plugin calls of a profile's top-level events, by name."""
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.op_count", description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="ocria-mini")
    ap.add_argument("--plugins", choices=("on", "off"), default="on")
    ap.add_argument("--mode", choices=("ar", "spec"), default="ar")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    preset = load_preset(args.preset)
    target, drafter = random_models(preset, "cpu", torch.bfloat16)
    target.text.fuse_projections()
    drafter.fuse_projections()
    policy = ExecutionPolicy.from_env(args.plugins)  # on: every kernel, less those OCRIA_DISABLE_KERNELS names
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
    first = int(prefill(target, use, tcache, dcache, 0, prompt, policy=policy).argmax(-1))
    slot, last = torch.zeros(1, dtype=torch.long), torch.tensor([first])
    params = SamplingTensors(torch.zeros(1), torch.ones(1), torch.zeros(1, dtype=torch.long),
                             torch.zeros(1, dtype=torch.long))
    decode_step(target, use, tcache, dcache, slot, last, params, L + 2 * block, True, policy)  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        decode_step(target, use, tcache, dcache, slot, last, params, L + 2 * block, True, policy)
    counts = count_ops(prof.events())
    header = result_header("op_count")
    result = {**header, "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "device": "cpu (proxy)", "preset": args.preset, "plugins": args.plugins, "mode": args.mode,
              "layers": len(target.text.layers), "ops_per_step": sum(counts.values()),
              "by_op": dict(counts.most_common())}
    print(f"{args.preset} {args.mode} plugins {args.plugins}: {result['ops_per_step']} ops per decode step")
    for name, n in counts.most_common(12):
        print(f"  {n:5d}  {name}")
    if args.out:  # appended: one file holds the runs of several code versions and modes
        out = Path(args.out)
        runs = json.loads(out.read_text()) if out.is_file() else []
        write_json([*runs, result], out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
