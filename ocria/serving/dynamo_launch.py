"""``ocria serve --frontend dynamo``: NVIDIA Dynamo's OpenAI-compatible frontend plus N ocria workers.

The frontend (``python -m dynamo.frontend``) serves ``/v1/chat/completions`` and routes each request to one
worker (``ocria.serving.dynamo_worker``, one engine loop each; one per GPU with ``--gpus``). Without etcd or
NATS: file-based discovery in a private directory and a TCP request plane. On loopback (the default) every
address a Dynamo process binds is pinned to 127.0.0.1, not only the HTTP one. Discovery settings already in the
environment (``DYN_DISCOVERY_BACKEND``, ``DYN_FILE_KV``, ``ETCD_ENDPOINTS`` ...) are kept, so workers started
by hand on other machines can join the same deployment.

Ready means: every worker is listed by the frontend's ``/health``. A worker that dies is reported, its entries
are removed from file discovery (a killed worker cannot unregister itself, and the frontend would keep routing
requests to it), and the frontend keeps serving with the others; the frontend dying, or the last worker, stops
everything.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ocria.errors import OcriaError
from ocria.serving import ENSEMBLE
from ocria.serving.dynamo_worker import ENDPOINT, READY_LINE

LOOPBACK = ("127.0.0.1", "localhost", "::1")
# Where Dynamo processes bind besides the HTTP port; each defaults to the machine's network address.
HOST_VARIABLES = ("DYN_TCP_RPC_HOST", "DYN_TCP_RESPONSE_STREAM_HOST", "DYN_SYSTEM_HOST", "DYN_EVENT_PLANE_HOST")


@dataclass(frozen=True)
class DynamoOptions:
    engine: Path
    workers: int = 1
    gpus: tuple[int, ...] = ()  # one worker per GPU (CUDA_VISIBLE_DEVICES); empty: all workers on ``device``
    device: str = "cpu"  # cpu | gpu, for workers without a GPU of their own
    host: str = "127.0.0.1"
    http_port: int = 8000
    max_batch: int | None = None
    log_dir: Path | None = None  # default: a temporary directory (tails shown on failure)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass
class Process:
    name: str
    proc: subprocess.Popen
    log: Path


@dataclass
class DynamoDeployment:
    opts: DynamoOptions
    frontend: Process | None = None
    workers: list[Process] = field(default_factory=list)

    def __post_init__(self):
        if self.opts.workers < 1:
            raise OcriaError(f"--workers must be >= 1, got {self.opts.workers}")
        if self.opts.gpus and len(self.opts.gpus) != self.opts.workers:
            raise OcriaError(f"--gpus lists {len(self.opts.gpus)} GPUs for {self.opts.workers} workers: one worker "
                             "per GPU")
        if not (Path(self.opts.engine) / "manifest.json").is_file():
            raise OcriaError(f"{self.opts.engine}: not an engine directory (no manifest.json); build one with "
                             "ocria-build engine")
        self._tmp = tempfile.TemporaryDirectory(prefix="ocria-dynamo-")
        self.log_dir = Path(self.opts.log_dir or self._tmp.name)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.env = self._environment()

    @property
    def url(self) -> str:
        host = self.opts.host if ":" not in self.opts.host else f"[{self.opts.host}]"
        return f"http://{host}:{self.opts.http_port}"

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("DYN_DISCOVERY_BACKEND", "file")
        env.setdefault("DYN_REQUEST_PLANE", "tcp")
        if env["DYN_DISCOVERY_BACKEND"] == "file":
            env.setdefault("DYN_FILE_KV", str(Path(self._tmp.name) / "discovery"))
        if self.opts.host in LOOPBACK:
            env.update({name: "127.0.0.1" for name in HOST_VARIABLES})
        return env

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> Process:
        log = self.log_dir / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        return Process(name, proc, log)

    def _check_port(self) -> None:
        family = socket.AF_INET6 if ":" in self.opts.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((self.opts.host, self.opts.http_port))
            except OSError as e:
                why = "is already in use" if e.errno == errno.EADDRINUSE else f"cannot be bound ({e.strerror})"
                raise OcriaError(f"HTTP port {self.opts.http_port} on {self.opts.host} {why}: choose another with "
                                 "--http-port") from None

    def start(self) -> None:
        self._check_port()
        env = self.env
        self.frontend = self._spawn("frontend", [
            sys.executable, "-m", "dynamo.frontend", "--discovery-backend", env["DYN_DISCOVERY_BACKEND"],
            "--request-plane", env["DYN_REQUEST_PLANE"], "--http-host", self.opts.host,
            "--http-port", str(self.opts.http_port)], env)
        for i in range(self.opts.workers):
            wenv, device = dict(env), "cuda" if self.opts.device == "gpu" else "cpu"
            if self.opts.gpus:
                wenv["CUDA_VISIBLE_DEVICES"], device = str(self.opts.gpus[i]), "cuda"
            cmd = [sys.executable, "-m", "ocria.serving.dynamo_worker", "--engine", str(self.opts.engine),
                   "--device", device, "--model-name", ENSEMBLE]
            if self.opts.max_batch:
                cmd += ["--max-batch", str(self.opts.max_batch)]
            self.workers.append(self._spawn(f"worker{i}", cmd, wenv))

    def instances(self) -> int:
        """How many ocria workers the frontend lists (0 while it is not up)."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
                health = json.loads(r.read())
        except (OSError, ValueError):
            return 0
        namespace, component, endpoint = ENDPOINT.split(".")
        return sum(1 for i in health.get("instances", []) if (i.get("namespace"), i.get("component"),
                                                              i.get("endpoint")) == (namespace, component, endpoint))

    def check_frontend(self) -> None:
        if self.frontend.proc.poll() is not None:
            raise OcriaError(f"the Dynamo frontend exited (code {self.frontend.proc.returncode}):\n"
                             f"{_tail(self.frontend.log)}")

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.instances() < self.opts.workers:
            self.check_frontend()
            for w in self.workers:
                if w.proc.poll() is not None:
                    raise OcriaError(f"{w.name} exited (code {w.proc.returncode}) before it was ready:\n"
                                     f"{_tail(w.log)}")
            if time.monotonic() > deadline:
                raise OcriaError(f"not ready after {timeout_s:.0f} s ({self.instances()} of {self.opts.workers} "
                                 f"workers registered); logs in {self.log_dir}")
            time.sleep(0.5)

    def dead_workers(self) -> list[Process]:
        return [w for w in self.workers if w.proc.poll() is not None]

    def deregister(self, worker: Process) -> int:
        """Remove a dead worker's entries from file discovery, which the frontend watches; returns how many.

        The worker's instance id is in its ready line. Other discovery backends expire a dead worker's lease
        themselves, and a worker that never became ready registered nothing."""
        if self.env["DYN_DISCOVERY_BACKEND"] != "file":
            return 0
        ready = [line for line in _tail(worker.log, 10_000).splitlines() if line.startswith(READY_LINE)]
        if not ready or "instance " not in ready[-1]:
            return 0
        suffix = "%2F" + ready[-1].rsplit("instance ", 1)[1].rstrip(")")
        root = Path(self.env["DYN_FILE_KV"]) / "v1"
        entries = [p for kind in ("instances", "mdc") if (root / kind).is_dir()
                   for p in (root / kind).iterdir() if p.name.endswith(suffix)]
        for p in entries:
            p.unlink(missing_ok=True)
        return len(entries)

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM to the workers (they unregister and drain), then to the frontend; SIGKILL what is left."""
        procs = [w.proc for w in self.workers] + ([self.frontend.proc] if self.frontend else [])
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._tmp.cleanup()
