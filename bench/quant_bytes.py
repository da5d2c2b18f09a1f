"""Weight bytes one decode step reads, per quantization recipe, for a ~2B Qwen3.5-architecture target.

Counted from shapes alone (the model is built on the meta device) and the recipes' per-layer
formats, so it needs no GPU: every text-decoder tensor plus the LM head (tied to the embeddings,
so the whole vocabulary matrix) is read once per step whatever the batch; the vision encoder does
not run during decode and the embedding lookup reads one row per token (not counted). Stored
bytes per format: bf16 2 B/weight; fp8 1 B/weight + fp32 weight_scale + input_scale; nvfp4
0.5 B/weight + one E4M3 scale per 16 weights + fp32 weight_scale_2 + input_scale.
The time floor divides by the H200 copy bandwidth measured in MISSION.md §5 (4.14 TB/s).

    python bench/quant_bytes.py --out bench/results/quant_bytes_2b.json
"""

import argparse
import datetime
import json
import shlex
import sys
from pathlib import Path

import torch
from torch import nn

from ocria.models import OCRiaConfig, OCRiaForConditionalGeneration
from ocria.quant.recipe import load_recipe

H200_BANDWIDTH = 4.14e12  # bytes/s, device copy bandwidth measured on the H200 (MISSION.md §5)
CONFIG_2B = {
    "model_type": "qwen3_5",
    "tie_word_embeddings": True,
    "text_config": {
        "hidden_size": 2048, "num_hidden_layers": 24, "full_attention_interval": 4, "intermediate_size": 6144,
        "vocab_size": 248320, "tie_word_embeddings": True,
        "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
    },
    "vision_config": {"out_hidden_size": 2048},
}
RECIPES = ("bf16", "fp8", "nvfp4", "mixed")


def linear_bytes(weight_shape: torch.Size, fmt: str) -> int:
    n, k = weight_shape
    if fmt == "bf16":
        return 2 * n * k
    if fmt == "fp8":
        return n * k + 4 + 4
    return n * k // 2 + n * (k // 16) + 4 + 4


def component(name: str) -> str:
    for key in ("lm_head", "mlp", "self_attn", "linear_attn"):
        if key in name:
            return {"self_attn": "attention", "linear_attn": "gdn"}.get(key, key)
    return "norms"


def step_bytes(model: nn.Module, formats: dict[str, str]) -> dict[str, int]:
    """Bytes per decode step by component for per-linear ``formats`` (missing = bf16)."""
    modules = dict(model.named_modules())
    out: dict[str, int] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if not (name.startswith("model.language_model.") or name == "lm_head.weight") or "embed_tokens" in name:
            continue
        owner = name.rsplit(".", 1)[0]
        if isinstance(modules[owner], nn.Linear) and name.endswith(".weight"):
            size = linear_bytes(param.shape, formats.get(owner, "bf16"))
        else:
            size = 2 * param.numel()
        out[component(name)] = out.get(component(name), 0) + size
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="results JSON to write")
    args = ap.parse_args(argv)
    cfg = OCRiaConfig.from_dict(CONFIG_2B)
    with torch.device("meta"):
        model = OCRiaForConditionalGeneration(cfg)
    modules = dict(model.named_modules())
    total_params = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("model.visual."))
    rows = {}
    for name in RECIPES:
        formats = load_recipe(name).formats(modules) if name != "bf16" else {}
        parts = step_bytes(model, formats)
        total = sum(parts.values())
        counts = {f: sum(1 for v in formats.values() if v == f) for f in ("fp8", "nvfp4")}
        rows[name] = {"bytes": total, "components": parts, "quantized_linears": counts,
                      "floor_us_at_4.14TBps": total / H200_BANDWIDTH * 1e6}
    base = rows["bf16"]["bytes"]
    for row in rows.values():
        row["vs_bf16"] = row["bytes"] / base
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": "none (computed from shapes on the meta device; floor uses the H200 bandwidth of MISSION.md §5)",
        "command": " ".join(["python", shlex.quote(sys.argv[0]), *map(shlex.quote, argv or sys.argv[1:])]),
        "config": CONFIG_2B,
        "text_params": total_params,
        "recipes": rows,
    }
    print(f"~2B Qwen3.5 target ({total_params / 1e9:.2f} B text params, tied 248k head); bytes read per decode step")
    print(f"{'recipe':8} {'MB':>9} {'vs bf16':>8} {'floor µs':>9}  " + "  ".join(
        f"{c:>9}" for c in ("lm_head", "mlp", "attention", "gdn", "norms")))
    for name, row in rows.items():
        parts = row["components"]
        print(f"{name:8} {row['bytes'] / 1e6:9.1f} {row['vs_bf16']:8.3f} {row['floor_us_at_4.14TBps']:9.1f}  "
              + "  ".join(f"{parts.get(c, 0) / 1e6:9.1f}" for c in ("lm_head", "mlp", "attention", "gdn", "norms")))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
