"""`ocria serve` as a test starts it: a subprocess on free loopback ports, ready when it prints `ready:`."""

import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from ocria.errors import OcriaError
from ocria.serving.process import ServeProcess
from ocria.serving.tritonserver import Ports

START_TIMEOUT_S = 300


@dataclass
class Server:
    proc: subprocess.Popen
    ports: Ports
    engine: Path
    lines: list
    log: Path

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.ports.grpc}"

    def http(self, path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports.http}{path}", timeout=5) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    def metrics(self, instance_labels: bool = False) -> dict[str, float]:
        """The ``ocria_*`` series by name and labels; the engine instance's ``instance`` and ``device`` labels are left
        out of the keys (these servers run one engine instance) unless ``instance_labels``."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports.metrics}/metrics", timeout=5) as r:
            text = r.read().decode()
        series = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                  for line in text.splitlines() if line.startswith("ocria_")}
        if instance_labels:
            return series
        return {re.sub(r',?(instance|device)="[^"]*"', "", k).replace("{,", "{"): v for k, v in series.items()}

    def triton_pid(self) -> int | None:
        for line in self.lines:
            m = re.search(r"starting tritonserver \(pid (\d+)\)", line)
            if m:
                return int(m.group(1))
        return None


@contextmanager
def serving(engine: Path, log: Path, *args: str, python: str | Path = sys.executable) -> Iterator[Server]:
    """``python -m ocria.cli serve --engine ENGINE ARGS`` until it is ready; stopped (and its tritonserver with it,
    if it has to be killed) on exit."""
    ports = Ports.free()
    try:
        served = ServeProcess(["--engine", str(engine), "--grpc-port", str(ports.grpc), "--http-port", str(ports.http),
                               "--metrics-port", str(ports.metrics), "--log-file", str(log), "--ready-timeout",
                               str(START_TIMEOUT_S), *args], START_TIMEOUT_S + 30, python)
    except OcriaError as e:
        pytest.fail(str(e))
    server = Server(served.proc, ports, engine, served.lines, log)
    try:
        yield server
    finally:
        served.stop(60)
        pid = server.triton_pid()
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
