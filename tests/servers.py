"""`ocria serve` as a test starts it: a subprocess on free loopback ports, ready when it prints `ready:`."""

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

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


def _pump(stream, lines: list, q: queue.Queue) -> None:
    for line in stream:
        lines.append(line)
        q.put(line)
    q.put(None)


@contextmanager
def serving(engine: Path, log: Path, *args: str, python: str | Path = sys.executable) -> Iterator[Server]:
    """``python -m ocria.cli serve --engine ENGINE ARGS`` until it is ready; stopped (and its tritonserver with it,
    if it has to be killed) on exit."""
    ports = Ports.free()
    cmd = [str(python), "-m", "ocria.cli", "serve", "--engine", str(engine), "--grpc-port", str(ports.grpc),
           "--http-port", str(ports.http), "--metrics-port", str(ports.metrics), "--log-file", str(log),
           "--ready-timeout", str(START_TIMEOUT_S), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines, q = [], queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, lines, q), daemon=True).start()
    server = Server(proc, ports, engine, lines, log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S + 30
        while True:
            line = q.get(timeout=max(1.0, deadline - time.monotonic()))
            if line is None:
                pytest.fail(f"ocria serve exited ({proc.wait()}):\n{''.join(lines)}")
            if line.startswith("ready:"):
                break
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        pid = server.triton_pid()
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
