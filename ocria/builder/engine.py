"""``ocria-build engine``: target + drafter + tokenizer/processor + manifest, built atomically.

Everything is written into a temporary directory beside ``out`` and renamed into place at the end,
so an interrupted or failed build never leaves a half-written engine.

The manifest records the format cost table the build planned with (``format_costs``, ``ocria.quant.costs``): the
one given (``format_costs``, measured on the device by ``ocria bench formats``), or the default model of the target
GPU architecture (``gpu_arch``; else the build machine's; else ``DEFAULT_ARCH``), marked ``"source": "default"``.
"""

import datetime as dt
import json
import shutil
import tempfile
from pathlib import Path

import torch
from tqdm import tqdm

import ocria
from ocria.builder.presets import load_preset, preset_checkpoints, save_drafter, save_target
from ocria.device import resolve_device
from ocria.errors import OcriaError
from ocria.manifest import MANIFEST, file_table
from ocria.models import DFlash2Drafter, OCRiaForConditionalGeneration
from ocria.quant.costs import DEFAULT_ARCH, DEFAULT_MODELS, CostTable, decode_gemms
from ocria.staging import staged_directory

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json",
                   "special_tokens_map.json", "chat_template.jinja")


def gpu_arch() -> str | None:
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def _tokenizer_source(target_dir: Path, fallback: Path) -> Path:
    return target_dir if (target_dir / "tokenizer.json").is_file() else fallback


def build_engine(out: str | Path, target: str | Path | None = None, drafter: str | Path | None = None,
                 recipe: str | None = None, preset: str = "ocria-mini", force: bool = False,
                 calib: str = "synthetic:32", allow_vision_quant: bool = False,
                 profile: dict | None = None, progress: bool = True, device: str = "cpu",
                 format_costs: str | Path | None = None, target_arch: str | None = None) -> Path:
    """Build an engine directory at ``out`` and return its path. ``device`` is where a quantized build
    calibrates and checks accuracy (the written engine is the same file format either way); ``format_costs`` (a
    measured table's JSON) or ``target_arch`` (its default model) is the cost table of the GPU it is built for."""
    out = Path(out)
    if out.exists() and not force:
        raise OcriaError(f"{out} already exists (use --force to replace it)")
    if drafter is not None and target is None:
        raise OcriaError("--drafter needs --target (the drafter must match its target)")
    spec = load_preset(preset)
    if format_costs is not None and target_arch is not None:
        raise OcriaError("--format-costs and --gpu-arch both name the GPU's costs: a measured table has its own arch")
    costs = CostTable.load(format_costs) if format_costs is not None else None
    if target_arch is not None and target_arch not in DEFAULT_MODELS:
        raise OcriaError(f"--gpu-arch {target_arch}: no default format cost model (known: {', '.join(DEFAULT_MODELS)})")
    quant = None
    if recipe not in (None, "bf16"):
        from ocria.quant.calibrate import check_calib_spec
        from ocria.quant.recipe import load_recipe

        quant = load_recipe(recipe, allow_vision_quant=allow_vision_quant)  # refuse bad input before any work
        check_calib_spec(calib)
        calib_device = resolve_device(device)
    build_profile = {**spec.profile, **(profile or {})}
    with staged_directory(out) as tmp:
        steps = tqdm(total=5, desc="ocria-build engine", disable=not progress, unit="step")
        src = Path(tempfile.mkdtemp(dir=tmp))
        if target is None:
            steps.set_postfix_str(f"weights of preset {spec.name}")
            target_dir, drafter_dir = preset_checkpoints(spec, src)
        else:
            target_dir, drafter_dir = Path(target), Path(drafter) if drafter else None
        steps.update()
        steps.set_postfix_str("target")
        model = OCRiaForConditionalGeneration.from_pretrained(target_dir)
        gemms = decode_gemms(model.text_config)
        if costs is None:
            costs = CostTable.default(target_arch or gpu_arch() or DEFAULT_ARCH, gemms)
        costs.check_covers(gemms)
        if quant is None:
            save_target(model, tmp / "target", torch.bfloat16)
        else:
            from ocria.quant.build import quantize_target

            report = quantize_target(model.to(calib_device), quant, calib, tmp / "target",
                                     _tokenizer_source(target_dir, spec.assets), progress=progress, costs=costs)
            (tmp / "accuracy.json").write_text(json.dumps(report, indent=2) + "\n")
        steps.update()
        block_size = 1
        if drafter_dir is not None:
            steps.set_postfix_str("drafter")
            draft_model = DFlash2Drafter.from_pretrained(drafter_dir, model)
            save_drafter(draft_model, tmp / "drafter", torch.bfloat16)
            block_size = draft_model.config.block_size
        steps.update()
        steps.set_postfix_str("tokenizer")
        tok_src = _tokenizer_source(target_dir, spec.assets)
        (tmp / "tokenizer").mkdir()
        copied = [f for f in TOKENIZER_FILES if (tok_src / f).is_file()]
        if "tokenizer.json" not in copied or "preprocessor_config.json" not in copied:
            raise OcriaError(f"{tok_src}: needs tokenizer.json and preprocessor_config.json")
        for name in copied:
            shutil.copy2(tok_src / name, tmp / "tokenizer" / name)
        steps.update()
        steps.set_postfix_str("manifest")
        origin = f"preset:{spec.name} (seed {spec.seed})" if target is None else None
        sources = {"target": {"path": origin or str(target_dir), "files": file_table(target_dir)}}
        if drafter_dir is not None:
            sources["drafter"] = {"path": origin or str(drafter_dir), "files": file_table(drafter_dir)}
        shutil.rmtree(src)
        manifest = {
            "format": "ocria-engine/1",
            "ocria_version": ocria.__version__,
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "preset": spec.name if target is None else None,
            "sources": sources,
            "recipe": recipe or "bf16",
            # the recipe's decisions, which the loader follows (and checks against the stored tensors)
            "quantized_layers": {} if quant is None else report["quantized_layers"],
            "profile": {**build_profile, "block_size": block_size, "dtype": "bfloat16", "gpu_arch": gpu_arch()},
            "format_costs": costs.to_json(),
            "files": file_table(tmp),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        for path in [tmp, *tmp.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        steps.update()
        steps.close()
    return out
