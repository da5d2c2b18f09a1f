"""Resumable training state in a flat directory of small files: ``run.json`` plus safetensors shards.

Every file stays under ``MAX_SHARD_BYTES`` so a state directory comes back from the GPU machine's
$OUT (files of at most 16 MiB) and travels back in the next call. Writes are crash-safe: new shards
get a new generation name, ``run.json`` (the only pointer to them) is replaced atomically, and only
then are the previous shards deleted.
"""

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ocria.errors import CheckpointError

MAX_SHARD_BYTES = 15 * 1024 * 1024
RUN_FILE = "run.json"


def write_json(path: Path, data: dict) -> None:
    """Replace ``path`` atomically (temp file in the same directory, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def read_run(directory: Path) -> dict[str, Any] | None:
    path = Path(directory) / RUN_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None


def module_tensors(prefix: str, module: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters (shared ones once) under ``prefix``."""
    return {f"{prefix}.{n}": p.detach() for n, p in module.named_parameters()}


def load_module_tensors(module: nn.Module, prefix: str, tensors: dict[str, torch.Tensor]) -> None:
    params = dict(module.named_parameters())
    for name, p in params.items():
        key = f"{prefix}.{name}"
        if key not in tensors:
            raise CheckpointError(f"training state has no tensor {key!r}")
        if tensors[key].shape != p.shape:
            raise CheckpointError(f"training state tensor {key!r} has shape {tuple(tensors[key].shape)}, "
                                  f"expected {tuple(p.shape)}")
        with torch.no_grad():
            p.copy_(tensors[key])


def save_state(directory: Path, run: dict, tensors: dict[str, torch.Tensor], tag: str) -> list[str]:
    """Write ``tensors`` as shards named ``state-<tag>-<k>.safetensors``, point ``run['checkpoint']`` at
    them, replace run.json, then delete every other shard in ``directory``. Returns the shard names."""
    directory.mkdir(parents=True, exist_ok=True)
    pieces: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():  # tensors over a shard are cut along dim 0 into name#k parts
        t = tensor.detach().to("cpu").contiguous()
        rows = max(1, MAX_SHARD_BYTES // max(1, t[0].numel() * t.element_size())) if t.dim() else 1
        if t.dim() and t.numel() * t.element_size() > MAX_SHARD_BYTES:
            pieces.update({f"{name}#{k:03d}": part.clone() for k, part in enumerate(t.split(rows))})
        else:
            pieces[name] = t
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(pieces):
        t = pieces[name]
        nbytes = t.numel() * t.element_size()
        if nbytes > MAX_SHARD_BYTES:
            raise CheckpointError(f"tensor {name!r} has rows larger than one shard ({MAX_SHARD_BYTES} bytes)")
        if size + nbytes > MAX_SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    names = []
    for k, shard in enumerate(shards):
        fname = f"state-{tag}-{k:02d}.safetensors"
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{fname}.")
        os.close(fd)
        save_file(shard, tmp)
        os.replace(tmp, directory / fname)
        names.append(fname)
    run["checkpoint"] = dict(run.get("checkpoint") or {}, files=names)
    write_json(directory / RUN_FILE, run)
    # Every other shard on disk is stale, whatever run.json said before: callers rebuild
    # run["checkpoint"] for each save, so its old file list is not a reliable inventory.
    for stale in directory.glob("state-*.safetensors"):
        if stale.name not in names:
            stale.unlink(missing_ok=True)
    return names


def load_state(directory: Path, run: dict) -> dict[str, torch.Tensor]:
    pieces: dict[str, torch.Tensor] = {}
    for fname in run["checkpoint"]["files"]:
        path = directory / fname
        if not path.is_file():
            raise CheckpointError(f"{path}: shard named in {RUN_FILE} is missing (copy the whole state directory)")
        pieces.update(load_file(str(path)))
    tensors = {n: t for n, t in pieces.items() if "#" not in n}
    for name in sorted({n.split("#")[0] for n in pieces if "#" in n}):
        tensors[name] = torch.cat([pieces[n] for n in sorted(pieces) if n.split("#")[0] == name])
    return tensors


def drop_state(directory: Path, run: dict) -> None:
    """Forget the in-progress checkpoint (its stage is finished)."""
    old = run.get("checkpoint") or {}
    run["checkpoint"] = None
    write_json(directory / RUN_FILE, run)
    for fname in old.get("files", []):
        (directory / fname).unlink(missing_ok=True)


def rng_tensors(generator: torch.Generator) -> dict[str, torch.Tensor]:
    out = {"rng.cpu": torch.get_rng_state(), "rng.sampler": generator.get_state()}
    if torch.cuda.is_available():
        out["rng.cuda"] = torch.cuda.get_rng_state()
    return out


def restore_rng(tensors: dict[str, torch.Tensor], generator: torch.Generator) -> None:
    torch.set_rng_state(tensors["rng.cpu"])
    generator.set_state(tensors["rng.sampler"])
    if torch.cuda.is_available() and "rng.cuda" in tensors:
        torch.cuda.set_rng_state(tensors["rng.cuda"])
