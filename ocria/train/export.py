"""Export trained models as HF directories (config.json + bf16 model.safetensors), replaced atomically."""

import shutil
import tempfile
from pathlib import Path

import torch

from ocria.builder.presets import SHIPPED, Preset, save_drafter, save_target
from ocria.errors import OcriaError
from ocria.manifest import file_table
from ocria.models import DFlash2Drafter, OCRiaForConditionalGeneration
from ocria.train.checkpoint import write_json

MAX_SHIPPED_BYTES = 24 * 1000 * 1000


def _replace_dir(tmp: Path, directory: Path) -> Path:
    tmp.chmod(0o755)
    for f in tmp.iterdir():
        f.chmod(0o644)
    old = directory.with_name(f".{directory.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if directory.exists():
        directory.rename(old)
    tmp.rename(directory)
    shutil.rmtree(old, ignore_errors=True)
    return directory


def export_model(model: OCRiaForConditionalGeneration | DFlash2Drafter, directory: Path) -> Path:
    """Write ``model`` in bf16 to ``directory`` through a temp directory renamed into place."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}."))
    save = save_target if isinstance(model, OCRiaForConditionalGeneration) else save_drafter
    save(model, tmp, torch.bfloat16)
    return _replace_dir(tmp, directory)


@torch.no_grad()
def load_exported(model: OCRiaForConditionalGeneration | DFlash2Drafter, directory: Path, setting: str,
                  target: OCRiaForConditionalGeneration | None = None) -> dict:
    """Copy an exported (HF) model's weights into a training model built from the same preset, as fp32 masters:
    a later run continues a trained model (its optimizer moments start at zero, so give it a warmup). A drafter
    loads bound to ``target``. Returns the directory's file table, to record what the run started from by
    content: shipping replaces the directory it names."""
    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise OcriaError(f"{setting} {directory}: no config.json (expected an HF directory)")
    if isinstance(model, DFlash2Drafter):
        trained = DFlash2Drafter.from_pretrained(directory, target).state_dict()
    else:
        trained = OCRiaForConditionalGeneration.from_pretrained(directory, torch.float32, "cpu").state_dict()
    ours = model.state_dict()
    differ = sorted(k for k in ours.keys() | trained.keys()
                    if k not in ours or k not in trained or ours[k].shape != trained[k].shape)
    if differ:
        raise OcriaError(f"{setting} {directory}: not built like this run's model ({len(differ)} tensors differ, "
                         f"first {differ[0]!r})")
    for name, tensor in trained.items():
        ours[name].copy_(tensor)
    return {"path": str(directory), "files": file_table(directory)}


def shipped_bytes(*directories: Path) -> int:
    return sum(f.stat().st_size for d in directories for f in Path(d).glob("*.safetensors"))


def ship(target_dir: Path, drafter_dir: Path, preset: Preset, training: dict) -> tuple[Path, Path, Path]:
    """Copy trained target + drafter into the preset's assets (``target/``, ``drafter/``) after checking they
    load and fit the size budget, then write ``SHIPPED.json``: the preset, every file's sha256 (the builder
    refuses changed files) and ``training``, the run's record."""
    total = shipped_bytes(target_dir, drafter_dir)
    if total > MAX_SHIPPED_BYTES:
        raise OcriaError(f"trained weights are {total} bytes, over the {MAX_SHIPPED_BYTES}-byte budget")
    target = OCRiaForConditionalGeneration.from_pretrained(target_dir)
    DFlash2Drafter.from_pretrained(drafter_dir, target)
    assets = Path(preset.assets)
    out = []
    for src, name in ((target_dir, "target"), (drafter_dir, "drafter")):
        tmp = Path(tempfile.mkdtemp(dir=assets, prefix=f".{name}."))
        for f in ("config.json", "model.safetensors"):
            shutil.copy2(Path(src) / f, tmp / f)
        out.append(_replace_dir(tmp, assets / name))
    files = {f"{d.name}/{rel}": entry for d in out for rel, entry in file_table(d).items()}
    record = assets / SHIPPED
    write_json(record, {"preset": preset.name, "files": files, "training": training})
    return out[0], out[1], record
