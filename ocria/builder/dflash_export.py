"""Plain DFlash export of a DFlash2 drafter: the same checkpoint with DFlash2's local convolutions and candidate
selector taken out (``dflash_config`` without ``local_conv_kernel``/``selector_head``/``selector_threshold``, and
without their weights). This is the drafter TensorRT-LLM's DFlash path runs (it has neither part); our runtime
runs it too, which is how its acceptance is measured against DFlash2's."""

import json
import re
from pathlib import Path

from safetensors.torch import load_file, save_file

from ocria.errors import CheckpointError

DFLASH2_CONFIG = ("local_conv_kernel", "selector_head", "selector_threshold")
DFLASH2_WEIGHT = re.compile(r"(layers\.\d+\.local_conv|selector_head)\.")


def export_plain_dflash(src: Path, dest: Path) -> None:
    """Write ``src`` (a DFlash or DFlash2 drafter directory) to the new directory ``dest`` as plain DFlash."""
    config, weights = src / "config.json", src / "model.safetensors"
    if not config.is_file() or not weights.is_file():
        raise CheckpointError(f"{src}: a drafter needs config.json and a single model.safetensors")
    cfg = json.loads(config.read_text())
    if not isinstance(cfg.get("dflash_config"), dict):
        raise CheckpointError(f"{config}: no dflash_config; not a DFlash drafter")
    cfg["dflash_config"] = {k: v for k, v in cfg["dflash_config"].items() if k not in DFLASH2_CONFIG}
    kept = {k: v for k, v in load_file(weights).items() if not DFLASH2_WEIGHT.match(k)}
    dest.mkdir(parents=True)
    save_file(kept, dest / "model.safetensors", metadata={"format": "pt"})
    (dest / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
