"""A dying engine loop on the real server: open requests get an error, the model stops being ready,
new requests fail at once instead of hanging."""

import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ocria.builder.engine import build_engine
from ocria.serving.client import Client, ServerError
from ocria.serving.repo import RepoOptions, write_repo
from ocria.serving.tritonserver import Ports, TritonServer

EXAMPLE = Path(__file__).parent.parent / "examples" / "report.png"

# Appended to the generated engine model: the scheduler fails on its 4th step, as a lost device would.
FAULT = '''

_initialize = TritonPythonModel.initialize


def _initialize_with_fault(self, args):
    _initialize(self, args)
    step, calls = self.loop.scheduler.step, [0]

    def failing_step():
        calls[0] += 1
        if calls[0] > 3:
            raise RuntimeError("injected fault")
        return step()

    self.loop.scheduler.step = failing_step


TritonPythonModel.initialize = _initialize_with_fault
'''


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_dead_loop_unloads_the_model_and_fails_fast(tmp_path):
    engine = build_engine(tmp_path / "mini", progress=False)
    repo = write_repo(tmp_path / "repo", RepoOptions(engine))
    with open(repo / "ocria_engine" / "1" / "model.py", "a") as f:
        f.write(FAULT)
    server = TritonServer(repo, Ports.free(), log_path=tmp_path / "server.log")
    with server:
        ready = f"{server.http_url}/v2/models/ocria/ready"
        assert _status(ready) == 200
        client = Client(server.grpc_url, timeout_s=60)
        with pytest.raises(ServerError, match="engine loop died: RuntimeError: injected fault"):
            list(client.generate(EXAMPLE.read_bytes(), stream=True, max_tokens=50, temperature=0.9))
        deadline = time.monotonic() + 60
        while _status(ready) == 200:
            assert time.monotonic() < deadline, server.log_tail()
            time.sleep(0.2)
        t0 = time.monotonic()
        with pytest.raises(ServerError):
            list(client.generate(EXAMPLE.read_bytes(), max_tokens=4))
        assert time.monotonic() - t0 < 10
        assert "unloading ocria_engine" in server.log_path.read_text()
