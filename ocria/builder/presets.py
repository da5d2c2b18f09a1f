"""Model presets (``configs/presets/*.yaml``): architecture, build profile and where weights come from."""

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from safetensors.torch import save_file

import ocria
from ocria.errors import ConfigError
from ocria.manifest import verify_files
from ocria.models import DFlash2Drafter, DrafterConfig, OCRiaConfig, OCRiaForConditionalGeneration
from ocria.models.init import random_init

PACKAGE_DIR = Path(ocria.__file__).resolve().parent
CONFIG_DIR = PACKAGE_DIR.parent / "configs"
ASSETS_DIR = PACKAGE_DIR / "assets"
SHIPPED = "SHIPPED.json"  # beside trained target/ and drafter/: their preset, file table and training record


@dataclass
class Preset:
    name: str
    target: dict
    drafter: dict
    profile: dict
    seed: int
    assets: Path
    init: dict

    @property
    def tokenizer_dir(self) -> Path:
        return self.assets


def load_preset(name_or_path: str) -> Preset:
    path = Path(name_or_path)
    if not path.suffix:
        path = CONFIG_DIR / "presets" / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (CONFIG_DIR / "presets").glob("*.yaml"))
        raise ConfigError(f"unknown preset {name_or_path!r} (known: {', '.join(known) or 'none'}; looked in {path})")
    try:
        raw = yaml.safe_load(path.read_text())
        return Preset(name=raw["name"], target=raw["target"], drafter=raw["drafter"], profile=raw.get("profile", {}),
                      seed=int(raw.get("seed", 0)), assets=ASSETS_DIR / raw.get("assets", raw["name"]),
                      init=dict(raw.get("init") or {}))
    except (yaml.YAMLError, KeyError, TypeError) as e:
        raise ConfigError(f"{path}: malformed preset ({e})") from None


def _save_hf(directory: Path, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(directory / "model.safetensors"),
              metadata={"format": "pt"})
    return directory


def save_target(model: OCRiaForConditionalGeneration, directory: Path, dtype: torch.dtype) -> Path:
    """HF layout: config.json + model.safetensors (tied head stored once, as HF does)."""
    return _save_hf(directory, model.config.to_hf(), {n: p.to(dtype) for n, p in model.named_parameters()})


def save_drafter(model: DFlash2Drafter, directory: Path, dtype: torch.dtype) -> Path:
    return _save_hf(directory, model.config.to_hf(), {n: p.to(dtype) for n, p in model.named_parameters()})


def shipped_checkpoints(preset: Preset) -> tuple[Path, Path] | None:
    """The trained target/ and drafter/ in the preset's assets, checked against their ``SHIPPED.json``; None
    when the assets ship no weights or ship them for another preset (ocria-1-sim borrows ocria-mini's
    tokenizer, not its weights)."""
    assets = preset.assets
    record_path = assets / SHIPPED
    if not (assets / "target").is_dir() and not record_path.is_file():
        return None
    if not record_path.is_file():
        raise ConfigError(f"{assets / 'target'}: trained weights without {record_path.name} "
                          "(ship them with python -m ocria.train ship)")
    try:
        record = json.loads(record_path.read_text())
        preset_name, files = record["preset"], record["files"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise ConfigError(f"{record_path}: malformed ({e})") from None
    if preset_name != preset.name:
        return None
    verify_files(assets, files, record_path.name)
    return assets / "target", assets / "drafter"


def preset_checkpoints(preset: Preset, workdir: Path) -> tuple[Path, Path]:
    """The one path from a preset to weights: shipped trained checkpoints if the assets hold them,
    otherwise deterministic seeded weights written to ``workdir``."""
    shipped = shipped_checkpoints(preset)
    if shipped is not None:
        return shipped
    target, drafter = random_models(preset, "cpu")
    return (save_target(target, workdir / "target", torch.bfloat16),
            save_drafter(drafter, workdir / "drafter", torch.bfloat16))


def random_models(preset: Preset, device: str, dtype: torch.dtype = torch.float32):
    """The preset's seeded target and drafter, built directly on ``device`` (no checkpoint round trip)."""
    with torch.device(device):
        target = OCRiaForConditionalGeneration(OCRiaConfig.from_dict(preset.target))
        drafter = DFlash2Drafter(DrafterConfig.from_dict(preset.drafter))
    random_init(target, preset.seed, **preset.init)
    random_init(drafter, preset.seed + 1, **preset.init)
    target.to(dtype).tie_weights()
    return target.eval(), drafter.to(dtype).eval().bind(target.text.embed_tokens, target.lm_head)
