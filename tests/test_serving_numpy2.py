"""Serving from an environment with NumPy 2, as stock GPU images have it (the suite's own environment has 1.x).

The bundled tritonserver 2.51's Python stub corrupts tensors under NumPy 2. Two things must hold:
- ``ocria serve`` from a NumPy 2 environment gives the stub NumPy < 2 and serves every request right (the image
  arrives byte for byte: the answer is ``ocria run``'s, token for token);
- run under NumPy 2 as it is, the models refuse to load and the server never reports ready, with one line
  that says why and how to fix it.

The NumPy 2 environment is a virtual environment whose packages come from a NumPy 2 directory first, then from
this one: ``build/numpy2-site`` (``.ci/run`` installs it; made here with pip when missing).
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy
import pytest
from servers import serving

from ocria.serving.stub_env import overlay

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "report.png"
NUMPY2_SITE = ROOT / "build" / "numpy2-site"
SAMPLING = ["--temperature", "0.9", "--seed", "3", "--max-tokens", "12"]


def _numpy2_site() -> Path:
    site = Path(os.environ.get("OCRIA_NUMPY2_SITE", NUMPY2_SITE))
    if not (site / "numpy" / "__init__.py").is_file():
        tmp = site.with_name(site.name + ".tmp")
        out = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                              "--no-deps", "--only-binary=:all:", "--target", str(tmp), "numpy>=2,<3"],
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, f"could not install NumPy 2 for this test into {site}: {out.stderr[-500:]}"
        tmp.rename(site)
    return site


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory):
    """The environments ocria makes (``stub_env``) go to a temporary cache, here and in the servers started."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def numpy2_python(cache_home) -> Path:
    """A python3 whose NumPy is 2.x and whose other packages (torch, ocria, tritonclient ...) are this one's."""
    python = overlay(_numpy2_site()) / "python3"
    version = subprocess.run([str(python), "-c", "import numpy, ocria; print(numpy.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert version.startswith("2."), version
    return python


@pytest.fixture(scope="module")
def numpy1_dir(tmp_path_factory) -> Path:
    """This environment's NumPy 1.x as a directory to hand ``--stub-numpy`` (no download)."""
    assert numpy.__version__.startswith("1.")
    out = tmp_path_factory.mktemp("numpy1")
    installed = Path(numpy.__file__).parent
    for name in ("numpy", "numpy.libs"):
        if (installed.parent / name).exists():
            (out / name).symlink_to(installed.parent / name)
    return out


@pytest.fixture(scope="module")
def engine(mini_engine) -> Path:
    return mini_engine


def test_ocria_serve_from_a_numpy2_environment_reads_every_byte(numpy2_python, numpy1_dir, engine, tmp_path):
    want = json.loads(subprocess.run([sys.executable, "-m", "ocria.cli", "run", "--engine", str(engine), "--image",
                                      str(EXAMPLE), "--json", *SAMPLING], capture_output=True, text=True,
                                     check=True, timeout=300).stdout)
    with serving(engine, tmp_path / "server.log", "--stub-numpy", str(numpy1_dir), python=numpy2_python) as server:
        got = json.loads(subprocess.run([str(numpy2_python), "-m", "ocria.cli", "client", "--url", server.url,
                                         "--image", str(EXAMPLE), "--json", *SAMPLING],
                                        capture_output=True, text=True, check=True, timeout=300).stdout)
        assert got["text"] == want["text"] and got["token_ids"] == want["token_ids"]
        prompt = subprocess.run([str(numpy2_python), "-m", "ocria.cli", "client", "--url", server.url, "--image",
                                 str(EXAMPLE), "--prompt", "Lis ce document, s'il te plaît.", "--stop", "##",
                                 "--max-tokens", "4"], capture_output=True, text=True, timeout=300)
        assert prompt.returncode == 0, prompt.stderr  # STRING inputs (instruction, stop words) cross intact too


def test_the_stub_under_numpy2_never_reports_ready(numpy2_python, engine, tmp_path):
    """Without NumPy < 2 the bundled stub would corrupt every image: each model refuses to load instead."""
    script = textwrap.dedent(f"""
        import dataclasses
        from pathlib import Path
        from ocria.errors import OcriaError
        from ocria.serving.repo import RepoOptions, write_repo
        from ocria.serving.tritonserver import Ports, TritonServer, find_server
        repo = write_repo(Path({str(tmp_path)!r}) / "repo", RepoOptions(Path({str(engine)!r})))
        raw = dataclasses.replace(find_server(), needs_numpy1=False)  # the stub as it is, under NumPy 2
        server = TritonServer(repo, Ports.free(), install=raw)
        server.start()
        try:
            server.wait_ready(240)
            print("READY")
        except OcriaError as e:
            print("REFUSED", e, "ready" if server.is_ready() else "not-ready")
        finally:
            server.stop()
    """)
    out = subprocess.run([str(numpy2_python), "-c", script], capture_output=True, text=True, timeout=300)
    line = out.stdout.strip()
    assert line.startswith("REFUSED") and line.endswith("not-ready") and "\n" not in line, out.stdout + out.stderr
    assert "builds wrong NumPy arrays under NumPy 2." in line and "NumPy < 2" in line and "24.11" in line
    assert "Traceback" not in line and "At:" not in line
