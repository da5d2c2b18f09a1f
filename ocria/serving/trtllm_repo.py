"""``ocria-build triton-repo --backend tensorrt-llm``: a deployment for TensorRT-LLM's Triton container.

The output directory holds two trees, each mounted into ``nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3``:

- ``models/``: the Triton model repository, TensorRT-LLM's ``llmapi`` Python model ``tensorrt_llm``. Its
  ``config.pbtxt`` declares the llmapi model's own tensors; ``1/model.yaml`` holds the ``LLM()`` arguments;
  ``1/model.py`` and ``1/helpers.py`` are copied from the container's ``all_models`` directory (``--trtllm-models``),
  never shipped by this project.
- ``engine/``: what ``model.yaml`` points at, mounted at ``--mount`` (default ``/engines/<engine name>``):
  ``target/`` (the engine's checkpoint with its processor and tokenizer files beside it, which TensorRT-LLM's
  multimodal input processor loads with ``AutoProcessor.from_pretrained``) and ``drafter/``, the engine's drafter
  as plain DFlash (``ocria.builder.dflash_export``: TensorRT-LLM has no local convolution or selector). Target
  weights are hard-linked from the engine when the filesystem allows, copied otherwise.

Every ``model.yaml`` key is checked against the fields of TensorRT-LLM's argument classes and every tensor against
the llmapi model's config, both recorded with their commits in ``trtllm_fields.json``; ``--trtllm-models``'s own
``config.pbtxt`` must declare the same tensors, so a container too old for images (no ``image_url``) is refused.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath

import yaml

from ocria.builder.dflash_export import export_plain_dflash
from ocria.errors import ConfigError, OcriaError
from ocria.serving.repo import TEMPLATES, engine_profile, fill, parse_config
from ocria.staging import staged_directory

FIELDS_FILE = Path(__file__).with_name("trtllm_fields.json")
MODEL = "tensorrt_llm"
LLMAPI = Path("llmapi") / MODEL  # the llmapi model inside the container's all_models directory
COPIED = ("model.py", "helpers.py")  # TensorRT-LLM's own code, taken from the container at build time
PROCESSOR_FILES = ("preprocessor_config.json", "tokenizer.json", "tokenizer_config.json")  # required
OPTIONAL_PROCESSOR_FILES = ("special_tokens_map.json", "chat_template.jinja")


@dataclass(frozen=True)
class TrtllmRepoOptions:
    engine: Path
    trtllm_models: Path | None  # the container's all_models directory
    mount: str | None = None  # where engine/ is mounted in the container; default /engines/<engine name>
    max_batch: int | None = None  # LLM(max_batch_size); default: the engine profile's


@cache
def recorded() -> dict:
    """TensorRT-LLM's argument field lists and llmapi model tensors, as read from its source (with commits)."""
    return json.loads(FIELDS_FILE.read_text())


def _mount(opts: TrtllmRepoOptions, engine: Path) -> str:
    mount = opts.mount or f"/engines/{engine.name}"
    path = PurePosixPath(mount)
    if not path.is_absolute() or ".." in path.parts or any(c.isspace() or c in "${}'\"" for c in mount):
        raise OcriaError(f"--mount must be an absolute container path without '..', spaces or quotes, got {mount!r}")
    return str(path)


def _llmapi_sources(all_models: Path | None) -> Path:
    if all_models is None:
        raise OcriaError("--backend tensorrt-llm needs --trtllm-models DIR: the all_models directory of the "
                         "TensorRT-LLM Triton container (it holds llmapi/tensorrt_llm/1/model.py and helpers.py)")
    src = all_models / LLMAPI
    missing = [str(src / "1" / f) for f in COPIED if not (src / "1" / f).is_file()]
    if not (src / "config.pbtxt").is_file():
        missing.append(str(src / "config.pbtxt"))
    if missing:
        raise OcriaError(f"--trtllm-models {all_models}: not TensorRT-LLM's all_models directory (missing "
                         f"{', '.join(missing)})")
    return src


def _values(opts: TrtllmRepoOptions, engine: Path, mount: str) -> dict[str, str]:
    profile = engine_profile(engine)
    max_batch = opts.max_batch or profile.max_batch_size
    if max_batch < 1:
        raise OcriaError(f"--max-batch must be >= 1, got {max_batch}")
    drafter = engine / "drafter" / "config.json"
    if not drafter.is_file():
        raise OcriaError(f"{engine}: no drafter/config.json; the tensorrt-llm backend needs the DFlash drafter")
    cfg = json.loads(drafter.read_text())
    dflash = cfg.get("dflash_config", {})
    if "mask_token_id" not in dflash or "target_layer_ids" not in dflash or "block_size" not in cfg:
        raise ConfigError(f"{drafter}: missing block_size or dflash_config.mask_token_id/target_layer_ids")
    return {
        "mount": mount,
        "max_batch_size": str(max_batch),
        "max_draft_len": str(int(cfg["block_size"]) - 1),  # a DFlash block is the last token + its drafts
        "mask_token_id": str(int(dflash["mask_token_id"])),
        "target_layer_ids": json.dumps([int(i) for i in dflash["target_layer_ids"]]),
        "max_seq_len": str(profile.max_seq_len),
    }


def _place(src: Path, dest: Path) -> None:
    """Hard-link ``src`` at ``dest`` (weights can be gigabytes), copying where linking is not possible."""
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def _export_engine(engine: Path, dest: Path) -> None:
    """engine/target + engine/tokenizer's processor files -> dest/target; engine/drafter as plain DFlash ->
    dest/drafter."""
    tok = engine / "tokenizer"
    missing = [f for f in PROCESSOR_FILES if not (tok / f).is_file()]
    if missing:
        raise OcriaError(f"{engine}: tokenizer/ lacks {', '.join(missing)}; rebuild the engine with ocria-build engine")
    if not (engine / "target" / "config.json").is_file():
        raise OcriaError(f"{engine}: target/config.json missing; rebuild the engine with ocria-build engine")
    (dest / "target").mkdir(parents=True)
    for f in sorted(p for p in (engine / "target").iterdir() if p.is_file()):
        _place(f, dest / "target" / f.name)
    export_plain_dflash(engine / "drafter", dest / "drafter")
    for name in PROCESSOR_FILES + OPTIONAL_PROCESSOR_FILES:
        f, there = tok / name, dest / "target" / name
        if not f.is_file():
            continue
        if there.exists():
            if not filecmp.cmp(f, there, shallow=False):
                raise OcriaError(f"{engine}: target/{name} and tokenizer/{name} differ; which one applies is unclear")
            continue
        _place(f, there)


def tensors(cfg) -> dict[str, list[dict]]:
    """A parsed config's inputs and outputs in the form ``trtllm_fields.json`` records them."""
    from tritonclient.grpc import model_config_pb2

    def row(t, with_optional: bool) -> dict:
        out = {"name": t.name, "data_type": model_config_pb2.DataType.Name(t.data_type), "dims": list(t.dims)}
        return out | {"optional": t.optional} if with_optional else out

    return {"input": [row(t, True) for t in cfg.input], "output": [row(t, False) for t in cfg.output]}


def _container_tensors(config_pbtxt: Path) -> tuple[dict, dict]:
    cfg = parse_config(config_pbtxt)
    return ({t.name: t for t in cfg.input}, {t.name: t for t in cfg.output})


def _check_container(src: Path, written: Path) -> None:
    """The container's llmapi model must take every tensor ours declares, alike, and require no other."""
    ours_in, ours_out = _container_tensors(written)
    theirs_in, theirs_out = _container_tensors(src / "config.pbtxt")
    for kind, ours, theirs in (("input", ours_in, theirs_in), ("output", ours_out, theirs_out)):
        for name, t in ours.items():
            other = theirs.get(name)
            if other is None or other.data_type != t.data_type or list(other.dims) != list(t.dims):
                raise OcriaError(f"{src / 'config.pbtxt'}: {kind} {name!r} missing or of another type/shape; this "
                                 "TensorRT-LLM container's llmapi model does not match the one recorded in "
                                 f"{FIELDS_FILE.name} (commit {recorded()['llmapi_model']['commit'][:12]})")
    required = sorted(n for n, t in theirs_in.items() if not t.optional and n not in ours_in)
    if required:
        raise OcriaError(f"{src / 'config.pbtxt'}: requires inputs {required} that the recorded llmapi model lacks")


def write_trtllm_repo(out: str | Path, opts: TrtllmRepoOptions, force: bool = False) -> Path:
    """Write ``out/models`` (the Triton repository) and ``out/engine`` (mounted at ``--mount``), atomically."""
    out = Path(out)
    if out.exists() and not force:
        raise OcriaError(f"{out} already exists (use --force to replace it)")
    src = _llmapi_sources(opts.trtllm_models)
    engine = opts.engine.resolve()
    mount = _mount(opts, engine)
    values = _values(opts, engine, mount)
    templates = TEMPLATES / "tensorrt-llm" / MODEL
    with staged_directory(out) as tmp:
        model = tmp / "models" / MODEL
        (model / "1").mkdir(parents=True)
        for rel in ("config.pbtxt", "1/model.yaml"):
            (model / rel).write_text(fill((templates / rel).read_text(), values, f"tensorrt-llm/{MODEL}/{rel}"))
        for name in COPIED:
            shutil.copy2(src / "1" / name, model / "1" / name)
        _export_engine(engine, tmp / "engine")
        _check_container(src, model / "config.pbtxt")
        validate_trtllm_repo(tmp)
    return out


def check_llm_args(opts: dict, where: str) -> None:
    """Every key of a model.yaml (less triton_config) must be a field of TensorRT-LLM's argument classes."""
    args = recorded()["llm_args"]
    fields, aliases = args["fields"], args["aliases"]
    unknown = sorted(set(opts) - set(fields["TorchLlmArgs"]))
    if unknown:
        raise ConfigError(f"{where}: {unknown[0]!r} is not an LLM() argument (TorchLlmArgs at TensorRT-LLM "
                          f"{args['commit'][:12]})")
    for key, cls in args["nested"].items():
        value = opts.get(key)
        if not isinstance(value, dict):
            continue
        known = set(fields[cls]) | set(aliases.get(cls, {}))
        unknown = sorted(set(value) - known)
        if unknown:
            raise ConfigError(f"{where}: {key}.{unknown[0]} is not a field of {cls} (TensorRT-LLM "
                              f"{args['commit'][:12]})")


def validate_trtllm_repo(out: Path) -> dict:
    """Check ``out/models`` against the recorded llmapi contract and ``out/engine`` as its paths need it.

    Returns the parsed ``model.yaml``."""
    contract = recorded()["llmapi_model"]
    model = out / "models" / MODEL
    cfg = parse_config(model / "config.pbtxt")
    if (cfg.name, cfg.backend) != (MODEL, contract["backend"]):
        raise ConfigError(f"{model}/config.pbtxt: must be model {MODEL!r} on the python backend")
    if cfg.max_batch_size or cfg.HasField("model_transaction_policy"):
        raise ConfigError(f"{model}/config.pbtxt: max_batch_size and decoupled belong in 1/model.yaml's triton_config")
    group = contract["instance_group"]
    if [(g.count, type(g).Kind.Name(g.kind)) for g in cfg.instance_group] != [(group["count"], group["kind"])]:
        raise ConfigError(f"{model}/config.pbtxt: instance_group must be one {group['kind']} instance, as the "
                          "llmapi model's (LLM() starts its own GPU workers)")
    got = tensors(cfg)
    for kind in ("input", "output"):
        if got[kind] != contract[kind]:
            diff = sorted({t["name"] for t in got[kind]} ^ {t["name"] for t in contract[kind]}) or "types/dims/order"
            raise ConfigError(f"{model}/config.pbtxt: {kind}s differ from the llmapi model's (commit "
                              f"{contract['commit'][:12]}): {diff}")
    for f in COPIED:
        if not (model / "1" / f).is_file():
            raise ConfigError(f"{model}/1/{f}: missing")
    path = model / "1" / "model.yaml"
    opts = yaml.safe_load(path.read_text())
    tc = opts.get("triton_config") or {}
    unknown = sorted(set(tc) - set(contract["triton_config_keys"]))
    if unknown:
        raise ConfigError(f"{path}: triton_config key {unknown[0]!r} is not read by the llmapi model")
    if tc.get("max_batch_size") != 0 or tc.get("decoupled") is not True or tc.get("multimodal") is not True:
        raise ConfigError(f"{path}: triton_config must have max_batch_size 0, decoupled true and multimodal true")
    check_llm_args({k: v for k, v in opts.items() if k != "triton_config"}, str(path))
    spec = opts.get("speculative_config") or {}
    if spec.get("decoding_type") != "DFlash" or int(spec.get("max_draft_len", 0)) < 1:
        raise ConfigError(f"{path}: speculative_config needs decoding_type DFlash and max_draft_len >= 1")
    mount = PurePosixPath(opts["model"]).parent
    needs = {"model": ("target", ("config.json",) + PROCESSOR_FILES), "tokenizer": ("target", PROCESSOR_FILES)}
    for key, (part, files) in needs.items():
        if PurePosixPath(opts.get(key, "")) != mount / part:
            raise ConfigError(f"{path}: {key} must be {mount / part}")
        missing = [f for f in files if not (out / "engine" / part / f).is_file()]
        if missing:
            raise ConfigError(f"{out}/engine/{part}: missing {', '.join(missing)}")
    if PurePosixPath(spec.get("speculative_model_dir", "")) != mount / "drafter":
        raise ConfigError(f"{path}: speculative_model_dir must be {mount / 'drafter'}")
    if not (out / "engine" / "drafter" / "config.json").is_file():
        raise ConfigError(f"{out}/engine/drafter: missing config.json")
    return opts
