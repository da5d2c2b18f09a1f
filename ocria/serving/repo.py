"""Fill the model-repository templates of ``triton_repo/`` for one engine, validate, write atomically.

Every generated ``config.pbtxt`` is parsed by Triton's own ModelConfig protobuf (shipped with
tritonclient) and refused if any ``${...}`` placeholder is left; ensembles are checked for wiring
(every step input produced earlier, every mapped name declared by the composing model).
"""

from __future__ import annotations

import json
import re
import shutil
import string
from dataclasses import dataclass
from pathlib import Path

import ocria
from ocria.errors import ConfigError, OcriaError
from ocria.manifest import EngineProfile
from ocria.staging import staged_directory

TEMPLATES = Path(ocria.__file__).resolve().parent.parent / "triton_repo"
PLACEHOLDER = re.compile(r"\$\{[^}]*\}")


@dataclass(frozen=True)
class RepoOptions:
    engine: Path
    instances: int = 1
    max_batch: int | None = None  # default: the engine profile's max_batch_size
    device: str = "cpu"  # cpu | gpu
    cancellation_check_period_ms: int = 100
    gpus: tuple[int, ...] = ()  # device gpu: one engine instance on each of these GPUs (default: Triton's choice)


def engine_profile(engine: Path) -> EngineProfile:
    """The engine's build profile, read from its manifest (OcriaError for a missing or unreadable one)."""
    manifest = engine / "manifest.json"
    if not manifest.is_file():
        raise OcriaError(f"{engine}: not an engine directory (no manifest.json); build one with ocria-build engine")
    try:
        return EngineProfile.from_manifest(json.loads(manifest.read_text()))
    except json.JSONDecodeError as e:
        raise OcriaError(f"{manifest}: not valid JSON ({e.msg})") from None


def _values(opts: RepoOptions) -> dict[str, str]:
    engine = opts.engine.resolve()
    profile = engine_profile(engine)
    max_batch = opts.max_batch or profile.max_batch_size
    if opts.instances < 1 or max_batch < 1:
        raise OcriaError(f"--instances and --max-batch must be >= 1 (got {opts.instances}, {max_batch})")
    if opts.device not in ("cpu", "gpu"):
        raise OcriaError(f"--device must be cpu or gpu, got {opts.device!r}")
    if opts.gpus and (opts.device != "gpu" or min(opts.gpus) < 0 or len(set(opts.gpus)) != len(opts.gpus)):
        raise OcriaError(f"--gpus needs --device gpu and distinct GPU indices >= 0, got {list(opts.gpus)} on "
                         f"{opts.device}")
    values = {
        "engine_dir": str(engine),
        "max_batch_size": str(max_batch),
        "scheduler_max_batch_size": str(max_batch),
        "instances": str(opts.instances),
        "instance_kind": "KIND_GPU" if opts.device == "gpu" else "KIND_CPU",
        "instance_gpus": f" gpus: {list(opts.gpus)}" if opts.gpus else "",
        "engine_device": "cuda" if opts.device == "gpu" else "cpu",
        "cancellation_check_period_ms": str(opts.cancellation_check_period_ms),
    }
    return values


def fill(text: str, values: dict[str, str], name: str) -> str:
    try:
        out = string.Template(text).substitute(values)
    except (KeyError, ValueError) as e:
        raise ConfigError(f"{name}: template placeholder {e} has no value") from None
    return out


def write_repo(out: str | Path, opts: RepoOptions, force: bool = False) -> Path:
    """Write the model repository for ``opts.engine`` to ``out`` (temp dir + rename: never half-written).

    The TensorRT-LLM variant is written by ``ocria.serving.trtllm_repo``."""
    out = Path(out)
    if out.exists() and not force:
        raise OcriaError(f"{out} already exists (use --force to replace it)")
    values = _values(opts)
    src = TEMPLATES / "ocria"
    with staged_directory(out) as tmp:
        for path in sorted(src.rglob("*")):
            if path.is_dir() or "__pycache__" in path.parts:
                continue
            dest = tmp / path.relative_to(src)
            dest.parent.mkdir(parents=True, exist_ok=True)
            if path.name == "config.pbtxt":
                dest.write_text(fill(path.read_text(), values, str(path.relative_to(TEMPLATES))))
            else:
                shutil.copy2(path, dest)
        for cfg in tmp.glob("*/config.pbtxt"):  # Triton needs a version directory, even an ensemble's
            (cfg.parent / "1").mkdir(exist_ok=True)
        validate_repo(tmp)
    return out


def parse_config(path: Path):
    """A config.pbtxt parsed by Triton's ModelConfig protobuf; ConfigError on leftovers or syntax errors."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    text = path.read_text()
    left = PLACEHOLDER.findall(text)
    if left:
        raise ConfigError(f"{path}: unfilled placeholder(s) {sorted(set(left))}")
    try:
        return text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as e:
        raise ConfigError(f"{path}: not a valid Triton model config ({e})") from None


def validate_repo(repo: Path) -> dict:
    """Parse every model config and check the ensemble wiring; returns {name: config}."""
    configs = {}
    for cfg_path in sorted(repo.glob("*/config.pbtxt")):
        cfg = parse_config(cfg_path)
        if cfg.name != cfg_path.parent.name:
            raise ConfigError(f"{cfg_path}: name {cfg.name!r} differs from its directory")
        if not (cfg_path.parent / "1").is_dir():
            raise ConfigError(f"{cfg_path.parent}: no version directory 1/")
        configs[cfg.name] = cfg
    expected = {"ocria", "preprocessing", "ocria_engine", "postprocessing"}
    if set(configs) != expected:
        raise ConfigError(f"{repo}: expected models {sorted(expected)}, found {sorted(configs)}")
    for name in ("preprocessing", "ocria_engine", "postprocessing"):
        if not (repo / name / "1" / "model.py").is_file():
            raise ConfigError(f"{repo / name}: missing 1/model.py")
    _check_ensemble(configs["ocria"], configs)
    return configs


def _check_ensemble(ens, configs: dict) -> None:
    available = {t.name for t in ens.input}
    for step in ens.ensemble_scheduling.step:
        model = configs.get(step.model_name)
        if model is None:
            raise ConfigError(f"ensemble {ens.name}: step model {step.model_name!r} is not in the repository")
        inputs = {t.name: t for t in model.input}
        for key, value in step.input_map.items():
            if key not in inputs:
                raise ConfigError(f"ensemble {ens.name}: {step.model_name} has no input {key!r}")
            if value not in available:
                raise ConfigError(f"ensemble {ens.name}: {value!r} feeds {step.model_name}.{key} before it exists")
        required = {n for n, t in inputs.items() if not t.optional}
        if required - set(step.input_map):
            raise ConfigError(f"ensemble {ens.name}: {step.model_name} inputs {sorted(required - set(step.input_map))} "
                              "are not mapped")
        outputs = {t.name for t in model.output}
        for key, value in step.output_map.items():
            if key not in outputs:
                raise ConfigError(f"ensemble {ens.name}: {step.model_name} has no output {key!r}")
            available.add(value)
        if model.max_batch_size < ens.max_batch_size:
            raise ConfigError(f"ensemble {ens.name}: {step.model_name} max_batch_size {model.max_batch_size} "
                              f"< the ensemble's {ens.max_batch_size}")
    missing = {t.name for t in ens.output} - available
    if missing:
        raise ConfigError(f"ensemble {ens.name}: outputs {sorted(missing)} are produced by no step")

