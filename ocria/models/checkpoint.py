"""Read HF safetensors checkpoints (single file or sharded index) into a module, with errors that
name the file and the tensor instead of a traceback from deep inside."""

import json
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from ocria.errors import CheckpointError

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def checkpoint_files(directory: Path) -> dict[str, Path]:
    """Map every tensor name to the safetensors file that holds it."""
    directory = Path(directory)
    index = directory / "model.safetensors.index.json"
    single = directory / "model.safetensors"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: malformed index ({e})") from None
        return {name: directory / fname for name, fname in weight_map.items()}
    if single.is_file():
        return {name: single for name in _keys(single)}
    raise CheckpointError(f"{directory}: no model.safetensors or model.safetensors.index.json")


def _keys(path: Path) -> list[str]:
    try:
        with safe_open(path, framework="pt") as f:
            return list(f.keys())
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path}: unreadable safetensors file ({e})") from None


def read_tensors(directory: Path, names: list[str] | None = None) -> dict[str, torch.Tensor]:
    """Read the named tensors (all when None); missing names raise naming tensor and file."""
    files = checkpoint_files(directory)
    wanted = list(files) if names is None else names
    by_file: dict[Path, list[str]] = {}
    for name in wanted:
        if name not in files:
            raise CheckpointError(f"{directory}: tensor {name!r} is missing from the checkpoint")
        by_file.setdefault(files[name], []).append(name)
    out = {}
    for path, file_names in by_file.items():
        if not path.is_file():
            raise CheckpointError(f"{path}: shard listed in the index does not exist")
        try:
            with safe_open(path, framework="pt") as f:
                present = set(f.keys())
                for name in file_names:
                    if name not in present:
                        raise CheckpointError(f"{path}: tensor {name!r} listed in the index is not in the file")
                    out[name] = f.get_tensor(name)
        except (SafetensorError, OSError, RuntimeError) as e:
            raise CheckpointError(f"{path}: unreadable safetensors file ({e})") from None
    return out


def load_module(module: nn.Module, directory: Path, prefix_map: dict[str, str], dtype: torch.dtype,
                device: torch.device | str = "cpu", ignore: tuple[str, ...] = (),
                optional: tuple[str, ...] = ()) -> None:
    """Fill ``module``'s parameters from a checkpoint directory.

    ``prefix_map`` maps a module-name prefix to its checkpoint prefix (e.g. ``{"": "model."}``).
    Checkpoint tensors matching ``ignore`` patterns are skipped; parameters matching ``optional``
    may be absent (left as they are). Shapes and dtypes are checked per tensor.
    """
    files = checkpoint_files(directory)
    params = dict(module.named_parameters())
    wanted, missing = {}, []
    for pname in params:
        ckpt_name = _map_name(pname, prefix_map)
        if ckpt_name in files:
            wanted[pname] = ckpt_name
        elif not any(re.search(p, pname) for p in optional):
            missing.append(ckpt_name)
    if missing:
        raise CheckpointError(
            f"{directory}: tensor {missing[0]!r} is missing from the checkpoint"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    tensors = read_tensors(directory, list(wanted.values()))
    for pname, ckpt_name in wanted.items():
        t, p = tensors[ckpt_name], params[pname]
        where = f"{files[ckpt_name]}: tensor {ckpt_name!r}"
        if t.dtype not in FLOAT_DTYPES:
            raise CheckpointError(f"{where} has dtype {t.dtype}, expected a floating-point dtype")
        if tuple(t.shape) != tuple(p.shape):
            raise CheckpointError(f"{where} has shape {tuple(t.shape)}, expected {tuple(p.shape)}")
        _assign(module, pname, t.to(device=device, dtype=dtype))
    known = set(wanted.values())
    mapped_prefixes = tuple(v for v in prefix_map.values())
    extra = [n for n in files if n not in known and n.startswith(mapped_prefixes)
             and not any(re.search(p, n) for p in ignore)]
    if extra:
        raise CheckpointError(f"{files[extra[0]]}: unexpected tensor {extra[0]!r} (config/checkpoint mismatch?)")


def _map_name(pname: str, prefix_map: dict[str, str]) -> str:
    for src in sorted(prefix_map, key=len, reverse=True):
        if pname.startswith(src):
            return prefix_map[src] + pname[len(src):]
    return pname


def _assign(module: nn.Module, name: str, value: torch.Tensor) -> None:
    *path, leaf = name.split(".")
    owner = module
    for part in path:
        owner = getattr(owner, part)
    setattr(owner, leaf, nn.Parameter(value, requires_grad=False))
