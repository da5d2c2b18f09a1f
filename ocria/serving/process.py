"""``ocria serve`` in a child process, for whoever drives a server it starts (benchmarks, tests): started in its own
session, ready when it prints its ``ready:`` line, stopped with SIGTERM (SIGKILL to its group if it hangs)."""

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ocria.errors import OcriaError

READY_PREFIX = "ready:"


class ServeProcess:
    """Runs ``ocria serve ARGS`` and waits for it to be ready.

    Args:
        args: the arguments after ``ocria serve``.
        ready_timeout_s: seconds to wait for the ready line.
        python: the interpreter to run it with (default: this one).

    Attributes:
        proc: the child process.
        lines: everything it has printed so far (stdout and stderr), line by line.

    Raises:
        OcriaError: it exited, or was not ready in time (then it is stopped); the message has its last lines.
    """

    def __init__(self, args: list[str], ready_timeout_s: float, python: str | Path = sys.executable):
        self.proc = subprocess.Popen([str(python), "-m", "ocria.cli", "serve", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        printed: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, args=(printed,), daemon=True).start()
        deadline = time.monotonic() + ready_timeout_s
        while True:
            try:
                line = printed.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                self.stop()
                raise OcriaError(f"ocria serve not ready after {ready_timeout_s:.0f} s:\n{self.tail()}") from None
            if line is None:
                raise OcriaError(f"ocria serve exited (code {self.proc.wait()}):\n{self.tail()}")
            if line.startswith(READY_PREFIX):
                return

    def _pump(self, printed: queue.Queue) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            printed.put(line)
        printed.put(None)

    def tail(self, lines: int = 40) -> str:
        return "".join(self.lines[-lines:])

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, then SIGKILL to its process group after ``timeout_s``; returns its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode
