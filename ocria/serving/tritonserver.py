"""Find and run a real `tritonserver` (the one bundled in the nvidia-pytriton wheel, or one on PATH).

The bundled server needs three things its wheel does not set up by itself:
- a Python-backend directory holding the stub built for the running interpreter (we assemble one in a
  temporary directory instead of writing into site-packages);
- `LD_LIBRARY_PATH` with this interpreter's libpython first (else the system's libpython may load and
  extension modules fail with undefined symbols), then the wheel's bundled libraries;
- a `bin` first on `PATH` whose `python3` holds the models' packages, since the stub's interpreter finds them
  through it: this environment's own, or a NumPy < 2 overlay of it where the stub needs one (``stub_env``).

The model-repository API (load, unload, index) is restricted to a key only this process holds, on HTTP and gRPC:
no client can unload the engine. Ports are checked before the server starts, and a failed start is reported as
the one line of its log that says why.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import ocria
from ocria.errors import OcriaError

PYTHON_TAG = f"{sys.version_info.major}.{sys.version_info.minor}"
ADMIN_HEADER = "ocria-admin-key"  # the header a model-repository call must carry, with the server's key


@dataclass(frozen=True)
class ServerInstall:
    """Where a tritonserver binary and its Python backend live."""

    binary: Path
    python_backend: Path  # directory holding libtriton_python.so
    stub: Path | None  # stub for this interpreter to copy next to the backend; None: already in place
    libs: tuple[Path, ...] = ()  # extra shared-library directories (the wheel's bundled libs)
    needs_numpy1: bool = False  # a stub known to predate NumPy 2 (tritonserver 2.51 of nvidia-pytriton)


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
            return ServerInstall(root / "bin" / "tritonserver", root / "backends" / "python", stub, (libs,), True)
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


def server_env(install: ServerInstall, base: dict[str, str] | None = None,
               python_bin: Path | None = None) -> dict[str, str]:
    """Environment for the server and its Python-model stubs (see the module docstring for why); ``python_bin``:
    the ``bin`` whose ``python3`` the stubs use (default: this interpreter's)."""
    env = dict(os.environ if base is None else base)
    libdir = sysconfig.get_config_var("LIBDIR")
    ld = [p for p in [libdir, *map(str, install.libs)] if p]
    if env.get("LD_LIBRARY_PATH"):
        ld.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(ld)
    env["PATH"] = os.pathsep.join([str(python_bin or Path(sys.executable).parent), env.get("PATH", "")])
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

    def check(self, host: str) -> None:
        """One-line OcriaError naming the first port that is taken, the same, or unbindable on ``host``."""
        named = (("gRPC", "--grpc-port", self.grpc), ("HTTP", "--http-port", self.http),
                 ("metrics", "--metrics-port", self.metrics))
        if len({self.grpc, self.http, self.metrics}) < 3:
            raise OcriaError(f"the gRPC, HTTP and metrics ports must differ (got {self.grpc}, {self.http}, "
                             f"{self.metrics})")
        for what, flag, port in named:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError as e:
                    why = "is already in use" if e.errno == errno.EADDRINUSE else f"cannot be bound ({e.strerror})"
                    raise OcriaError(f"{what} port {port} on {host} {why}: choose another with {flag}") from None


# Lines of a tritonserver log that say why it did not start, most specific first.
_FAILURE_PATTERNS = (
    re.compile(r"failed to load '([^']+)' version \d+: \w+: (?:\w+: )?(.*)"),
    re.compile(r"\] \"?(failed to start [^\n]*?)\"?$"),
    re.compile(r"^error: (.*)"),
    re.compile(r"^E\d{4} [\d:.]+ \d+ [\w.]+:\d+\] \"?(.*?)\"?$"),
)


def failure_reason(log: str) -> str | None:
    """The one line of a tritonserver log that says why it stopped (a model's load error first), or None."""
    lines = log.splitlines()
    for pattern in _FAILURE_PATTERNS:
        for line in lines:
            m = pattern.search(line.strip())
            if m:
                text = " ".join(m.groups()[-1].split("\\n")[0].split())  # the log escapes a traceback's newlines
                return f"model '{m.group(1)}' did not load: {text}" if m.re is _FAILURE_PATTERNS[0] else text
    return None


@dataclass
class TritonServer:
    """One tritonserver process over a model repository; `with TritonServer(...) as s:` waits for ready."""

    repo: Path
    ports: Ports
    host: str = "127.0.0.1"
    log_path: Path | None = None
    exit_timeout_s: int = 10
    binary: Path | None = None  # a specific tritonserver (default: see find_server)
    install: ServerInstall | None = None  # what to run, as find_server describes it (default: find_server(binary))
    stub_numpy: Path | None = None  # a NumPy < 2 directory for the stubs (default: see stub_env.stub_bin)
    log: Callable[..., None] = print  # where start-up notes go
    proc: subprocess.Popen | None = field(default=None, init=False)
    _admin_key: str = field(default="", init=False, repr=False)
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
        admin = f"model-repository:{ADMIN_HEADER}={self._admin_key}"
        return [
            str(install.binary), f"--model-repository={self.repo}", f"--backend-directory={backends}",
            f"--grpc-address={h}", f"--grpc-port={p.grpc}", f"--http-address={h}", f"--http-port={p.http}",
            f"--metrics-address={h}", f"--metrics-port={p.metrics}", "--allow-metrics=true",
            "--allow-gpu-metrics=false", f"--exit-timeout-secs={self.exit_timeout_s}",
            # explicit mode lets the engine model unload itself when its loop dies (readiness goes false);
            # clients cannot: the repository API needs a key only this process knows
            "--model-control-mode=explicit", "--load-model=*", "--strict-readiness=true",
            f"--http-restricted-api={admin}", f"--grpc-restricted-protocol={admin}",
        ]

    def start(self) -> TritonServer:
        from ocria.serving.stub_env import stub_bin

        install = self.install or find_server(self.binary)
        check_libpython()
        self.ports.check(self.host)
        python_bin = stub_bin(install.needs_numpy1, self.stub_numpy, self.log)
        self._admin_key = secrets.token_hex(16)
        self._tmp = tempfile.TemporaryDirectory(prefix="ocria-triton-")
        backends = backend_directory(install, Path(self._tmp.name) / "backends")
        log_path = self.log_path or Path(self._tmp.name) / "server.log"
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(self.command(backends, install), env=server_env(install, python_bin=python_bin),
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.http_url}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        """Block until the server answers ready; raise with the one log line that says why if it exits or
        times out (and where the whole log is)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise OcriaError(self._failure("tritonserver exited before it was ready"))
            if self.is_ready():
                return
            time.sleep(0.25)
        raise OcriaError(self._failure(f"tritonserver not ready after {timeout_s:.0f}s"))

    def _failure(self, what: str) -> str:
        """``what: reason (full log: PATH)``; a log in the temporary directory is kept beside it first."""
        text = self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""
        reason = failure_reason(text)
        kept = self.log_path
        if kept is not None and self._tmp is not None and kept.is_relative_to(self._tmp.name):
            kept = Path(tempfile.gettempdir()) / f"ocria-tritonserver-{os.getpid()}.log"
            kept.write_text(text)
        return f"{what}: {reason or 'see the log'} (full log: {kept})"

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
