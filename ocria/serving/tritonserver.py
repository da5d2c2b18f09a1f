"""Find and run a real `tritonserver` (the one bundled in the nvidia-pytriton wheel, or one on PATH).

The bundled server needs three things its wheel does not set up by itself:
- a Python-backend directory holding the stub built for the running interpreter (we assemble one in a
  temporary directory instead of writing into site-packages);
- `LD_LIBRARY_PATH` with this interpreter's libpython first (else the system's libpython may load and
  extension modules fail with undefined symbols), then the wheel's bundled libraries;
- this environment's `bin` first on `PATH`, since the stub's interpreter finds its packages through the
  `python3` it sees there (numpy < 2 must hold there: numpy 2 silently corrupted UINT8 inputs).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import ocria
from ocria.errors import OcriaError

PYTHON_TAG = f"{sys.version_info.major}.{sys.version_info.minor}"


@dataclass(frozen=True)
class ServerInstall:
    """Where a tritonserver binary and its Python backend live."""

    binary: Path
    python_backend: Path  # directory holding libtriton_python.so
    stub: Path | None  # stub for this interpreter to copy next to the backend; None: already in place
    libs: tuple[Path, ...] = ()  # extra shared-library directories (the wheel's bundled libs)


def find_server(binary: str | Path | None = None) -> ServerInstall:
    """``binary`` if given (e.g. a Triton container's /opt/tritonserver/bin/tritonserver), else the server
    bundled in the nvidia-pytriton wheel, else one on PATH or in /opt/tritonserver."""
    if binary is None:
        try:
            import pytriton
        except ImportError:
            pytriton = None
        if pytriton is not None:
            root = Path(pytriton.__file__).parent / "tritonserver"
            stub = root / "python_backend_stubs" / PYTHON_TAG / "triton_python_backend_stub"
            if not stub.is_file():
                raise OcriaError(f"nvidia-pytriton has no Python backend stub for Python {PYTHON_TAG} ({stub})")
            libs = Path(pytriton.__file__).parent.parent / "nvidia_pytriton.libs"
            return ServerInstall(root / "bin" / "tritonserver", root / "backends" / "python", stub, (libs,))
        binary = shutil.which("tritonserver")
        if binary is None and Path("/opt/tritonserver/bin/tritonserver").is_file():
            binary = "/opt/tritonserver/bin/tritonserver"
        if binary is None:
            raise OcriaError("no tritonserver found: install the serve extra (pip install 'ocria[serve]') "
                             "or run inside NVIDIA's Triton container")
    binary = Path(binary).resolve()
    if not binary.is_file():
        raise OcriaError(f"{binary}: tritonserver binary not found")
    backend = binary.parent.parent / "backends" / "python"
    for needed in ("libtriton_python.so", "triton_python_backend_stub"):
        if not (backend / needed).is_file():
            raise OcriaError(f"tritonserver at {binary} has no Python backend {needed} in {backend}")
    return ServerInstall(binary, backend, None)


def check_libpython() -> None:
    """The stub links libpython3.X.so.1.0; a statically linked interpreter without it cannot host models."""
    soname = sysconfig.get_config_var("INSTSONAME") or f"libpython{PYTHON_TAG}.so.1.0"
    if (Path(sysconfig.get_config_var("LIBDIR") or "/nonexistent") / soname).is_file():
        return
    try:
        ctypes.CDLL(soname)
    except OSError:
        raise OcriaError(f"the Triton Python backend stub needs {soname}, which this Python does not provide "
                         f"(install the libpython{PYTHON_TAG} package or use a Python built with --enable-shared)"
                         ) from None


def server_env(install: ServerInstall, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for the server and its Python-model stubs (see the module docstring for why)."""
    env = dict(os.environ if base is None else base)
    libdir = sysconfig.get_config_var("LIBDIR")
    ld = [p for p in [libdir, *map(str, install.libs)] if p]
    if env.get("LD_LIBRARY_PATH"):
        ld.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(ld)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    # The models import ocria: make this checkout importable even when ocria is not pip-installed.
    src = str(Path(ocria.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([src, env["PYTHONPATH"]]) if env.get("PYTHONPATH") else src
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) // 2)))
    return env


def backend_directory(install: ServerInstall, into: Path) -> Path:
    """A backend directory whose `python/` holds the backend plus the stub for this interpreter."""
    python = into / "python"
    python.mkdir(parents=True, exist_ok=True)
    for item in install.python_backend.iterdir():
        if item.is_file():
            shutil.copy2(item, python / item.name)
    if install.stub is not None:
        shutil.copy2(install.stub, python / "triton_python_backend_stub")
    return into


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class Ports:
    grpc: int
    http: int
    metrics: int

    @classmethod
    def free(cls, host: str = "127.0.0.1") -> Ports:
        ports: set[int] = set()
        while len(ports) < 3:
            ports.add(free_port(host))
        return cls(*sorted(ports))


@dataclass
class TritonServer:
    """One tritonserver process over a model repository; `with TritonServer(...) as s:` waits for ready."""

    repo: Path
    ports: Ports
    host: str = "127.0.0.1"
    log_path: Path | None = None
    exit_timeout_s: int = 10
    binary: Path | None = None  # a specific tritonserver (default: see find_server)
    proc: subprocess.Popen | None = field(default=None, init=False)
    _tmp: tempfile.TemporaryDirectory | None = field(default=None, init=False)
    _log = None

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.ports.grpc}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.ports.http}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.ports.metrics}/metrics"

    def command(self, backends: Path, install: ServerInstall) -> list[str]:
        h, p = self.host, self.ports
        return [
            str(install.binary), f"--model-repository={self.repo}", f"--backend-directory={backends}",
            f"--grpc-address={h}", f"--grpc-port={p.grpc}", f"--http-address={h}", f"--http-port={p.http}",
            f"--metrics-address={h}", f"--metrics-port={p.metrics}", "--allow-metrics=true",
            "--allow-gpu-metrics=false", f"--exit-timeout-secs={self.exit_timeout_s}",
            # explicit mode lets the engine model unload itself when its loop dies (readiness goes false)
            "--model-control-mode=explicit", "--load-model=*", "--strict-readiness=true",
        ]

    def start(self) -> TritonServer:
        install = find_server(self.binary)
        check_libpython()
        self._tmp = tempfile.TemporaryDirectory(prefix="ocria-triton-")
        backends = backend_directory(install, Path(self._tmp.name) / "backends")
        log_path = self.log_path or Path(self._tmp.name) / "server.log"
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(self.command(backends, install), env=server_env(install),
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.http_url}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        """Block until the server answers ready; raise with the log tail if it exits or times out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise OcriaError(f"tritonserver exited before it was ready:\n{self.log_tail()}")
            if self.is_ready():
                return
            time.sleep(0.25)
        raise OcriaError(f"tritonserver not ready after {timeout_s:.0f}s:\n{self.log_tail()}")

    def log_tail(self, n: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self, timeout_s: float | None = None) -> int | None:
        """SIGTERM, wait for the graceful exit, SIGKILL the process group if it overstays."""
        rc = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout_s if timeout_s is not None else self.exit_timeout_s + 15)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait()
            rc = self.proc.returncode
            try:  # stubs left behind by a killed server share its process group
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._tmp is not None:
            if self.log_path is not None and self.log_path.is_relative_to(self._tmp.name):
                self.log_path = None
            self._tmp.cleanup()
            self._tmp = None
        return rc

    def __enter__(self) -> TritonServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
