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
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

import ocria
from ocria.errors import ConfigError, OcriaError

TEMPLATES = Path(ocria.__file__).resolve().parent.parent / "triton_repo"
BACKENDS = ("ocria", "tensorrt-llm")
PLACEHOLDER = re.compile(r"\$\{[^}]*\}")


@dataclass(frozen=True)
class RepoOptions:
    engine: Path
    instances: int = 1
    max_batch: int | None = None  # default: the engine profile's max_batch_size
    device: str = "cpu"  # cpu | gpu
    backend: str = "ocria"
    cancellation_check_period_ms: int = 100


def engine_profile(engine: Path) -> dict:
    manifest = engine / "manifest.json"
    if not manifest.is_file():
        raise OcriaError(f"{engine}: not an engine directory (no manifest.json); build one with ocria-build engine")
    try:
        return json.loads(manifest.read_text()).get("profile", {})
    except json.JSONDecodeError as e:
        raise OcriaError(f"{manifest}: not valid JSON ({e.msg})") from None


def _values(opts: RepoOptions) -> dict[str, str]:
    engine = opts.engine.resolve()
    profile = engine_profile(engine)
    max_batch = opts.max_batch or int(profile.get("max_batch_size", 8))
    if opts.instances < 1 or max_batch < 1:
        raise OcriaError(f"--instances and --max-batch must be >= 1 (got {opts.instances}, {max_batch})")
    if opts.device not in ("cpu", "gpu"):
        raise OcriaError(f"--device must be cpu or gpu, got {opts.device!r}")
    values = {
        "engine_dir": str(engine),
        "max_batch_size": str(max_batch),
        "scheduler_max_batch_size": str(max_batch),
        "instances": str(opts.instances),
        "instance_kind": "KIND_GPU" if opts.device == "gpu" else "KIND_CPU",
        "engine_device": "cuda" if opts.device == "gpu" else "cpu",
        "cancellation_check_period_ms": str(opts.cancellation_check_period_ms),
    }
    if opts.backend == "tensorrt-llm":
        values.update(_trtllm_values(engine, profile, max_batch))
    return values


def _trtllm_values(engine: Path, profile: dict, max_batch: int) -> dict[str, str]:
    """model.yaml fields for TensorRT-LLM's llmapi model: target checkpoint + DFlash speculative_config."""
    drafter = engine / "drafter" / "config.json"
    if not drafter.is_file():
        raise OcriaError(f"{engine}: no drafter/config.json; the tensorrt-llm backend needs the DFlash drafter")
    cfg = json.loads(drafter.read_text())
    dflash = cfg.get("dflash_config", {})
    if "mask_token_id" not in dflash or "target_layer_ids" not in dflash or "block_size" not in cfg:
        raise ConfigError(f"{drafter}: missing block_size or dflash_config.mask_token_id/target_layer_ids")
    return {
        "target_dir": str(engine / "target"),
        "tokenizer_dir": str(engine / "tokenizer"),
        "drafter_dir": str(engine / "drafter"),
        "max_draft_len": str(int(cfg["block_size"]) - 1),
        "mask_token_id": str(int(dflash["mask_token_id"])),
        "target_layer_ids": json.dumps([int(i) for i in dflash["target_layer_ids"]]),
        "max_seq_len": str(int(profile.get("max_seq_len", 2048))),
    }


def fill(text: str, values: dict[str, str], name: str) -> str:
    try:
        out = string.Template(text).substitute(values)
    except (KeyError, ValueError) as e:
        raise ConfigError(f"{name}: template placeholder {e} has no value") from None
    return out


def write_repo(out: str | Path, opts: RepoOptions, force: bool = False) -> Path:
    """Write the model repository for ``opts.engine`` to ``out`` (temp dir + rename: never half-written)."""
    out = Path(out)
    if opts.backend not in BACKENDS:
        raise OcriaError(f"--backend must be one of {BACKENDS}, got {opts.backend!r}")
    if out.exists() and not force:
        raise OcriaError(f"{out} already exists (use --force to replace it)")
    values = _values(opts)
    src = TEMPLATES / opts.backend
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        for path in sorted(src.rglob("*")):
            if path.is_dir() or "__pycache__" in path.parts:
                continue
            dest = tmp / path.relative_to(src)
            dest.parent.mkdir(parents=True, exist_ok=True)
            if path.name in ("config.pbtxt", "model.yaml"):
                dest.write_text(fill(path.read_text(), values, str(path.relative_to(TEMPLATES))))
            else:
                shutil.copy2(path, dest)
        for cfg in tmp.glob("*/config.pbtxt"):  # Triton needs a version directory, even an ensemble's
            (cfg.parent / "1").mkdir(exist_ok=True)
        validate_repo(tmp, opts.backend)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
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


def validate_repo(repo: Path, backend: str = "ocria") -> dict:
    """Parse every model config and check the ensemble wiring / llmapi files; returns {name: config}."""
    configs = {}
    for cfg_path in sorted(repo.glob("*/config.pbtxt")):
        cfg = parse_config(cfg_path)
        if cfg.name != cfg_path.parent.name:
            raise ConfigError(f"{cfg_path}: name {cfg.name!r} differs from its directory")
        if not (cfg_path.parent / "1").is_dir():
            raise ConfigError(f"{cfg_path.parent}: no version directory 1/")
        configs[cfg.name] = cfg
    for path in repo.rglob("*.yaml"):
        left = PLACEHOLDER.findall(path.read_text())
        if left:
            raise ConfigError(f"{path}: unfilled placeholder(s) {sorted(set(left))}")
    if backend == "ocria":
        expected = {"ocria", "preprocessing", "ocria_engine", "postprocessing"}
        if set(configs) != expected:
            raise ConfigError(f"{repo}: expected models {sorted(expected)}, found {sorted(configs)}")
        for name in ("preprocessing", "ocria_engine", "postprocessing"):
            if not (repo / name / "1" / "model.py").is_file():
                raise ConfigError(f"{repo / name}: missing 1/model.py")
        _check_ensemble(configs["ocria"], configs)
    else:
        _check_llmapi(repo, configs)
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


def _check_llmapi(repo: Path, configs: dict) -> None:
    if set(configs) != {"tensorrt_llm"}:
        raise ConfigError(f"{repo}: expected the single llmapi model 'tensorrt_llm', found {sorted(configs)}")
    cfg = configs["tensorrt_llm"]
    if cfg.backend != "python":
        raise ConfigError(f"{repo}/tensorrt_llm: the llmapi model runs on the python backend, not {cfg.backend!r}")
    names = {t.name for t in cfg.input}
    if not {"text_input", "max_tokens", "stream"} <= names:
        raise ConfigError(f"{repo}/tensorrt_llm: llmapi inputs text_input, max_tokens, stream are required")
    path = repo / "tensorrt_llm" / "1" / "model.yaml"
    if not path.is_file():
        raise ConfigError(f"{path}: missing")
    opts = yaml.safe_load(path.read_text())
    tc = opts.get("triton_config", {})
    if not tc.get("decoupled") or int(tc.get("max_batch_size", 0)) != cfg.max_batch_size:
        raise ConfigError(f"{path}: triton_config must be decoupled with max_batch_size {cfg.max_batch_size}")
    spec = opts.get("speculative_config", {})
    if spec.get("decoding_type") != "DFlash" or int(spec.get("max_draft_len", 0)) < 1:
        raise ConfigError(f"{path}: speculative_config needs decoding_type DFlash and max_draft_len >= 1")
    if not (Path(opts.get("model", "")) / "config.json").is_file():
        raise ConfigError(f"{path}: model {opts.get('model')!r} is not a checkpoint directory")
    if not (Path(spec.get("speculative_model_dir", "")) / "config.json").is_file():
        raise ConfigError(f"{path}: speculative_model_dir {spec.get('speculative_model_dir')!r} has no config.json")
