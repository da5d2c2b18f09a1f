"""The Python environment in which the Triton Python backend's stub runs the ocria models.

The stub embeds an interpreter that finds its packages through the ``python3`` first on ``PATH`` (a virtual
environment there is honoured; ``PYTHONPATH`` is not). tritonserver 2.51's stub - the one bundled in nvidia-pytriton
- is built with a pybind11 that predates NumPy 2: under NumPy 2 it corrupts STRING tensors and every NumPy array it
touches (``ocria.serving.tensors``). Stock GPU images carry NumPy 2, and downgrading NumPy there breaks the packages
built against it. So when this environment has NumPy 2 and the server's stub needs NumPy 1, ``ocria serve`` gives
the stub an overlay: a small virtual environment whose site-packages put a NumPy < 2 directory first and then this
environment's own packages (torch, transformers, ocria ...). The user's environment is left as it is.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import ocria
from ocria.errors import OcriaError

NUMPY1 = "numpy>=1.24,<2"
PYTHON_TAG = f"{sys.version_info.major}.{sys.version_info.minor}"


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ocria"


def numpy_major(python: str | Path = sys.executable) -> int:
    """NumPy's major version in ``python``'s environment (0 when NumPy is not installed)."""
    if Path(python) == Path(sys.executable):
        try:
            return int(importlib.metadata.version("numpy").split(".")[0])
        except importlib.metadata.PackageNotFoundError:
            return 0
    out = subprocess.run([str(python), "-c", "import numpy; print(numpy.__version__)"], capture_output=True,
                         text=True, timeout=120)
    return int(out.stdout.split(".")[0]) if out.returncode == 0 else 0


def numpy1_directory(given: Path | None, log=print) -> Path:
    """A directory holding NumPy < 2 for this Python: ``given``, or one installed once into the cache."""
    if given is not None:
        if not (given / "numpy" / "__init__.py").is_file():
            raise OcriaError(f"--stub-numpy {given}: no numpy package there (make one with "
                             f"`python -m pip install --target {given} '{NUMPY1}'`)")
        return given
    target = cache_dir() / f"numpy1-py{PYTHON_TAG}"
    if (target / "numpy" / "__init__.py").is_file():
        return target
    log(f"installing NumPy < 2 for the server's Python stub into {target} (tritonserver 2.51's stub corrupts "
        "tensors under NumPy 2; your environment keeps its NumPy)", flush=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".numpy1-", dir=target.parent))
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                              "--no-deps", "--only-binary=:all:", "--target", str(tmp), NUMPY1],
                             capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            reason = (out.stderr.strip().splitlines() or ["pip failed"])[-1]
            raise OcriaError(f"could not install {NUMPY1!r} for the server's Python stub ({reason}); on a machine "
                             f"that can, run `python{PYTHON_TAG} -m pip install --target DIR '{NUMPY1}'` and pass "
                             "--stub-numpy DIR")
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _site_packages() -> list[str]:
    """This environment's package directories, in import order."""
    dirs = [sysconfig.get_paths()["purelib"], *site.getsitepackages()]
    return list(dict.fromkeys(d for d in dirs if Path(d).is_dir()))


def overlay(first: Path) -> Path:
    """The ``bin`` directory of a virtual environment whose ``python3`` imports packages from ``first`` before
    this environment's (and ocria from this checkout). Made once per combination, then reused."""
    src = str(Path(ocria.__file__).resolve().parent.parent)
    paths = [str(first.resolve()), src]
    key = hashlib.sha256("\n".join([sys.executable, *paths, *_site_packages()]).encode()).hexdigest()[:12]
    root = cache_dir() / f"python{PYTHON_TAG}-overlay-{key}"
    if not (root / "bin" / "python3").exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".overlay-", dir=root.parent))
        try:
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp)], check=True,
                           capture_output=True, timeout=120)
            purelib = subprocess.run([str(tmp / "bin" / "python3"), "-c",
                                      "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                     check=True, capture_output=True, text=True, timeout=60).stdout.strip()
            # .pth files run in name order: `first` and this checkout, then this environment's packages
            # (addsitedir also runs their own .pth files: editable installs)
            Path(purelib, "00-ocria-first.pth").write_text("\n".join(paths) + "\n")
            Path(purelib, "01-ocria-env.pth").write_text(
                "".join(f"import site; site.addsitedir({d!r})\n" for d in _site_packages()))
            tmp.rename(root)  # nothing in a venv made --without-pip needs its own path but pyvenv.cfg's home
        except subprocess.CalledProcessError as e:
            raise OcriaError(f"could not make a Python environment for the server: {e.stderr.decode().strip()}") \
                from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return root / "bin"


def stub_bin(needs_numpy1: bool, numpy1: Path | None, log=print) -> Path:
    """The ``bin`` directory to put first on the server's PATH: this environment's own, or the NumPy < 2 overlay
    when the stub needs NumPy 1 (``needs_numpy1``, or ``numpy1`` given explicitly) and this environment has 2."""
    if numpy1 is None and not (needs_numpy1 and numpy_major() >= 2):
        return Path(sys.executable).parent
    bin_dir = overlay(numpy1_directory(numpy1, log))
    if numpy_major(bin_dir / "python3") >= 2:
        raise OcriaError(f"the server's Python environment {bin_dir.parent} still imports NumPy 2: remove it and retry")
    check_imports(bin_dir / "python3")
    return bin_dir


# What the ocria models import in the stub: checked up front, so a package that cannot live with NumPy < 2 is named
# here, not hidden behind transformers' lazy-import message in the server log.
MODEL_IMPORTS = ("import torch", "from transformers import PreTrainedTokenizerFast", "import ocria.runtime",
                 "import ocria.serving.protocol")
_IMPORT_CHECK = """
import sys
for statement in sys.argv[1:]:
    try:
        exec(statement)
    except Exception as e:
        root = e
        while root.__cause__ or root.__context__:
            root = root.__cause__ or root.__context__
        print(f"{statement}: {type(root).__name__}: {root}")
        sys.exit(1)
"""


def check_imports(python: Path) -> None:
    """One-line OcriaError naming the first model import that fails in ``python``, with its root cause."""
    out = subprocess.run([str(python), "-c", _IMPORT_CHECK, *MODEL_IMPORTS], capture_output=True, text=True,
                         timeout=300)
    if out.returncode != 0:
        reason = " ".join(out.stdout.split()) or (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise OcriaError(f"the server's Python environment ({python.parent.parent}: NumPy < 2, then this "
                         f"environment's packages) cannot import what the models need: {reason}")
