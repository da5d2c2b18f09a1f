"""Optional dependencies: a command that needs one names the package and the extra that installs it."""

import importlib
from types import ModuleType

from ocria.errors import OcriaError


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Import ``module``, or fail with one line: what needs it and ``pip install 'ocria[extra]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise OcriaError(f"{purpose} needs the Python package {module.split('.')[0]!r}, which is missing or broken "
                         f"({e}): pip install 'ocria[{extra}]'") from None
