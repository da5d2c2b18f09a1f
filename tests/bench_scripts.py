"""The benchmark scripts of ``bench/`` as modules, for tests of their CPU paths (``bench`` is not a package)."""

import importlib.util
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).parents[1] / "bench"


def load_bench(name: str) -> ModuleType:
    """``bench/<name>.py`` loaded as a fresh module (the scripts put their own folder on sys.path)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
