"""Kernel variants for the A/B benchmarks (``replay_ssm_ab.py``, ``silu_quant_ab.py``): a copy of a kernel file
given as ``name=path[:KEY=value;env.NAME=value;...]``, loaded as a module of its own with its attributes set, and
the environment it runs under."""

import contextlib
import importlib.util
import os
from dataclasses import dataclass, field
from types import ModuleType

ENV_PREFIX = "env."


@dataclass
class Variant:
    name: str
    path: str
    attrs: dict[str, int | float | str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    module: ModuleType | None = None


def _value(text: str) -> int | float | str:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_variant(spec: str) -> Variant:
    """``name=path[:KEY=value;KEY=value]``; a key ``env.NAME`` sets environment variable NAME, not an attribute."""
    name, sep, rest = spec.partition("=")
    if not sep or not name or not rest:
        raise SystemExit(f"--variant {spec!r}: use name=path[:KEY=value;...]")
    path, _, settings = rest.partition(":")
    if not os.path.isfile(path):
        raise SystemExit(f"--variant {name}: no kernel file at {path}")
    variant = Variant(name, path)
    for item in filter(None, settings.split(";")):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--variant {name}: setting {item!r} is not KEY=value")
        if key.startswith(ENV_PREFIX):
            variant.env[key.removeprefix(ENV_PREFIX)] = value
        else:
            variant.attrs[key] = _value(value)
    return variant


def load(variant: Variant) -> None:
    """The variant's kernel file as a fresh module, its attributes set (each must already exist: a typo fails)."""
    spec = importlib.util.spec_from_file_location(f"kernel_variant_{variant.name}", variant.path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # a broken patch: say which variant, not where inside the import machinery
        raise SystemExit(f"--variant {variant.name}: {variant.path} does not load: {type(e).__name__}: {e}") from None
    for key, value in variant.attrs.items():
        if not hasattr(module, key):
            raise SystemExit(f"--variant {variant.name}: {variant.path} has no attribute {key}")
        setattr(module, key, value)
    variant.module = module


def load_variants(specs: list[str]) -> list[Variant]:
    """Every ``--variant`` spec parsed and loaded; names must differ (they key the results)."""
    variants = [parse_variant(spec) for spec in specs]
    if len({v.name for v in variants}) != len(variants):
        raise SystemExit("--variant names must differ")
    for v in variants:
        load(v)
    return variants


@contextlib.contextmanager
def environment(env: dict[str, str]):
    """``env`` set in ``os.environ`` inside the block, the previous values restored after it."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
