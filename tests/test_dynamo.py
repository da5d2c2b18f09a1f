"""End to end on CPU: `ocria serve --frontend dynamo --workers 2` runs NVIDIA Dynamo's real frontend
(file discovery, TCP request plane, loopback) and two ocria workers; requests are OpenAI chat completions.

Needs the ``dynamo`` extra plus ``pip install --no-deps ai-dynamo==1.6.1`` (.ci/run installs both): without them
the fixture fails naming the pip command, it does not skip.
"""

import asyncio
import base64
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from ocria.cli import main
from ocria.errors import OcriaError
from ocria.serving import dynamo_worker
from ocria.serving.dynamo_launch import DynamoDeployment, DynamoOptions
from ocria.serving.dynamo_worker import ChatHandler, parse_chat, require_dynamo
from ocria.serving.process import ServeProcess
from ocria.serving.tritonserver import free_port

EXAMPLE = Path(__file__).parent.parent / "examples" / "report.png"
MANIFEST = Path(__file__).parent.parent / "deploy" / "dynamo" / "ocria.yaml"
SAMPLING = dict(temperature=0.9, seed=7, max_tokens=24)
START_TIMEOUT_S = 180


def data_uri(image: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(image).decode()}"


def chat(image_url: str, **body) -> dict:
    return {"model": "ocria", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": image_url}}]}], **body}


class Frontend:
    def __init__(self, url: str, proc: subprocess.Popen, lines: list[str]):
        self.url, self.proc, self.lines = url, proc, lines

    def post(self, body: dict, timeout: float = 120) -> tuple[int, dict | list[dict]]:
        """(HTTP status, the JSON body, or a streaming request's list of SSE events without [DONE])."""
        req = urllib.request.Request(f"{self.url}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                if not body.get("stream"):
                    return r.status, json.loads(r.read())
                events = []
                for line in r:
                    data = line.decode().strip().removeprefix("data:").strip()
                    if data and data != "[DONE]":
                        events.append(json.loads(data))
                return r.status, events
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def health_instances(self) -> int:
        with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
            return len(json.loads(r.read())["instances"])

    def worker_pids(self) -> list[int]:
        line = next(x for x in self.lines if x.startswith("starting the Dynamo frontend"))
        return [int(p) for p in line.split("(pids ")[1].split(")")[0].split()]


@pytest.fixture(scope="module")
def engine(mini_engine):
    return mini_engine


@pytest.fixture(scope="module")
def frontend(engine, tmp_path_factory):
    require_dynamo("tests/test_dynamo.py")
    port, logs = free_port(), tmp_path_factory.mktemp("dynamo-logs")
    try:
        served = ServeProcess(["--engine", str(engine), "--frontend", "dynamo", "--workers", "2", "--http-port",
                               str(port), "--log-file", str(logs), "--ready-timeout", str(START_TIMEOUT_S)],
                              START_TIMEOUT_S + 30)
    except OcriaError as e:
        pytest.fail(str(e))
    proc, lines = served.proc, served.lines
    try:
        yield Frontend(f"http://127.0.0.1:{port}", proc, lines)
    finally:
        served.stop(30)
    assert proc.returncode == 0, "".join(lines)
    assert "Dynamo deployment stopped" in "".join(lines)


@pytest.fixture(scope="module")
def run_json(engine) -> dict:
    """What `ocria run --json` prints for SAMPLING (a subprocess, as a user would run it)."""
    out = subprocess.run([sys.executable, "-m", "ocria.cli", "run", "--engine", str(engine), "--image", str(EXAMPLE),
                          "--json", "--temperature", str(SAMPLING["temperature"]), "--seed", str(SAMPLING["seed"]),
                          "--max-tokens", str(SAMPLING["max_tokens"])],
                         capture_output=True, text=True, check=True, timeout=300).stdout
    return json.loads(out)


def test_stream_and_non_stream_equal_ocria_run_on_both_workers(frontend, run_json):
    image = data_uri(EXAMPLE.read_bytes())
    fingerprints = set()
    for _ in range(2):  # round robin: every pair of requests reaches both workers
        status, events = frontend.post(chat(image, stream=True, **SAMPLING))
        assert status == 200 and len(events) > 2
        assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == run_json["text"]
        assert [t for e in events for t in e.get("nvext", {}).get("token_ids", [])] == run_json["token_ids"]
        assert events[-1]["choices"][0]["finish_reason"] == run_json["finish_reason"]
        assert events[-1]["usage"]["completion_tokens"] == len(run_json["token_ids"])
        fingerprints |= {e["system_fingerprint"] for e in events}
        status, whole = frontend.post(chat(image, **SAMPLING))
        assert status == 200 and whole["object"] == "chat.completion"
        assert whole["choices"][0]["message"]["content"] == run_json["text"]
        assert whole["nvext"]["token_ids"] == run_json["token_ids"]
        fingerprints.add(whole["system_fingerprint"])
    assert len(fingerprints) == 2 and frontend.health_instances() == 2
    # an instruction as a text part, and sampling options the Triton path takes too
    status, whole = frontend.post({"model": "ocria", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "Transcribe the page."}, {"type": "image_url", "image_url": {"url": image}}]}],
        "max_tokens": 5, "top_k": 3, "top_p": 0.9, "stop": ["\n\n\n"], "temperature": 0.5})
    assert status == 200 and whole["usage"]["completion_tokens"] <= 5


@pytest.mark.parametrize("body, message", [
    (chat(data_uri(b"not an image")), "image: not a readable image"),
    (chat("https://example.invalid/page.png"), "image_url must be a data URI"),
    (chat("data:image/png;base64,@@@"), "not valid base64"),
    ({"model": "ocria", "messages": [{"role": "user", "content": "no image"}]}, "exactly one image_url part"),
    (chat(data_uri(EXAMPLE.read_bytes()), max_tokens=100000), "beyond what fits in the engine's max length"),
    (chat(data_uri(EXAMPLE.read_bytes()), top_k=-1), "top_k must be >= 0"),
])
def test_bad_requests_get_400_with_the_reason(frontend, body, message):
    status, reply = frontend.post(body, timeout=30)
    assert status == 400 and message in reply["message"], reply
    # streaming: the frontend has already answered 200, so the reason comes as the stream's error event
    status, events = frontend.post({**body, "stream": True}, timeout=30)
    assert status == 200 and len(events) == 1
    assert events[0]["error"]["code"] == 400 and message in events[0]["error"]["message"]


def test_bench_serve_measures_the_openai_endpoint(frontend, tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "serve", "--backend", "openai", "--url", frontend.url, "--images", str(EXAMPLE),
                 "--concurrency", "2", "--duration", "2", "--warmup", "0", "--max-tokens", "8", "--out",
                 str(out)]) == 0, capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["backend"] == "openai-chat" and result["args"]["backend"] == "openai"
    point = result["points"][0]
    assert point["completed"] > 0 and point["errors"] == 0
    assert 0 < point["output_tokens"] <= 8 * point["completed"]  # from the workers' token ids, not estimated
    assert point["ttft_s"]["p50"] > 0 and point["server"] is None  # no --metrics-url: no server-side numbers
    # each reply names its worker: the two workers' shares of the completed requests
    assert sum(point["served_by"].values()) == point["completed"] and len(point["served_by"]) == 2
    assert main(["bench", "serve", "--backend", "openai", "--url", f"http://127.0.0.1:{free_port()}", "--images",
                 str(EXAMPLE)]) == 2
    assert "cannot reach an OpenAI-compatible server at http://127.0.0.1:" in capsys.readouterr().err


def test_a_worker_killed_mid_run_leaves_the_frontend_serving(frontend):
    """Runs last (it kills a worker). Requests on the killed worker end at once with an error, never hang;
    the other worker's finish; the frontend then serves every request with the remaining worker."""
    image = data_uri(EXAMPLE.read_bytes())
    started = [threading.Event() for _ in range(4)]
    results: dict[int, tuple[str, object]] = {}

    def stream(i: int) -> None:
        req = urllib.request.Request(f"{frontend.url}/v1/chat/completions", json.dumps(chat(
            image, stream=True, seed=i, max_tokens=150, ignore_eos=True)).encode(),
            {"Content-Type": "application/json"})
        events = []
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                for line in r:
                    data = line.decode().strip().removeprefix("data:").strip()
                    if data and data != "[DONE]":
                        events.append(json.loads(data))
                        started[i].set()
            last = events[-1]
            results[i] = ("error", last["error"]) if "error" in last else ("done", last["choices"][0])
        except OSError as e:
            results[i] = ("closed", repr(e))
        finally:
            started[i].set()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for e in started:
        assert e.wait(60)
    victim = frontend.worker_pids()[0]
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a request hung after its worker was killed"
    outcomes = [results[i][0] for i in range(4)]
    assert "done" in outcomes and set(outcomes) != {"done"}, results  # the survivor's finish, the victim's do not
    assert all(results[i][1]["finish_reason"] == "length" for i, o in enumerate(outcomes) if o == "done"), results
    assert all(o == "done" or (o == "error" and results[i][1]["code"] == 503) for i, o in enumerate(outcomes)), \
        results
    assert time.monotonic() - killed_at < 30
    # the launcher sees the death within a second and removes the worker from discovery: no request reaches it
    deadline = time.monotonic() + 10
    while not any("worker0 exited (code -9)" in x for x in frontend.lines) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert any("worker0 exited (code -9); the frontend routes to the others" in x for x in frontend.lines)
    deadline = time.monotonic() + 10
    while frontend.health_instances() != 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert frontend.health_instances() == 1
    statuses = [frontend.post(chat(image, max_tokens=4, seed=i), timeout=30)[0] for i in range(6)]
    assert statuses == [200] * 6, statuses
    assert frontend.proc.poll() is None


def test_chat_parsing_refuses_what_ocria_does_not_serve():
    image = data_uri(EXAMPLE.read_bytes())
    req = parse_chat({"messages": [{"role": "user", "content": [{"type": "text", "text": "Read it."},
                                                                 {"type": "image_url", "image_url": {"url": image}}]}],
                      "max_completion_tokens": 9, "seed": 2**64 - 1, "stop": "END", "ignore_eos": True})
    assert req.image == EXAMPLE.read_bytes() and req.prompt == "Read it." and req.max_tokens_given
    assert req.params.ignore_eos and not parse_chat(chat(image)).params.ignore_eos
    assert (req.params.max_tokens, req.params.seed, req.params.stop) == (9, 2**64 - 1, ("END",))
    assert parse_chat(chat(image)).prompt is None and not parse_chat(chat(image)).max_tokens_given
    for body, message in [
        ({"messages": []}, "messages must be a non-empty list"),
        ({"messages": [{"role": "system", "content": "x"}, *chat(image)["messages"]]}, "single user message"),
        (chat(image, n=2), "n must be 1"),
        (chat(image, ignore_eos="yes"), "ignore_eos must be true or false"),
        (chat(image, temperature="hot"), "temperature must be a number"),
        (chat(image, max_tokens=1.5), "max_tokens must be an integer"),
        (chat(image, stop=["x"] * 33), "stop: at most 32 strings"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "unsupported content part"),
    ]:
        with pytest.raises(OcriaError, match=message):
            parse_chat(body)


def test_launcher_refuses_bad_options_in_one_line(engine, tmp_path):
    with pytest.raises(OcriaError, match="--gpus lists 1 GPUs for 2 workers"):
        DynamoDeployment(DynamoOptions(engine, workers=2, gpus=(0,)))
    with pytest.raises(OcriaError, match="--workers must be >= 1"):
        DynamoDeployment(DynamoOptions(engine, workers=0))
    with pytest.raises(OcriaError, match="not an engine directory"):
        DynamoDeployment(DynamoOptions(tmp_path))
    deployment = DynamoDeployment(DynamoOptions(engine))
    assert deployment.env["DYN_TCP_RPC_HOST"] == "127.0.0.1" and deployment.env["DYN_SYSTEM_HOST"] == "127.0.0.1"
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = DynamoDeployment(DynamoOptions(engine, http_port=s.getsockname()[1]))
        with pytest.raises(OcriaError, match=f"HTTP port {s.getsockname()[1]} on 127.0.0.1 is already in use"):
            busy.start()
    assert busy.frontend is None and busy.workers == []
    deployment.stop()
    busy.stop()


def test_a_missing_dynamo_half_is_named_with_both_install_steps(engine, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "dynamo.frontend" else real(
        name, *a))
    assert main(["serve", "--engine", str(engine), "--frontend", "dynamo"]) == 2
    assert capsys.readouterr().err == (
        "ocria serve: error: ocria serve --frontend dynamo needs NVIDIA Dynamo, and dynamo.frontend is missing: "
        "pip install 'ocria[dynamo]' && pip install --no-deps ai-dynamo==1.6.1\n")


def test_kubernetes_manifest_structure():
    """deploy/dynamo/ocria.yaml cannot run here: its structure is what can be checked."""
    doc = yaml.safe_load(MANIFEST.read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("nvidia.com/v1alpha1", "DynamoGraphDeployment")
    services = doc["spec"]["services"]
    kinds = sorted(s["componentType"] for s in services.values())
    assert kinds == ["frontend", "worker"]
    frontend = next(s for s in services.values() if s["componentType"] == "frontend")
    worker = next(s for s in services.values() if s["componentType"] == "worker")
    assert frontend["extraPodSpec"]["mainContainer"]["command"][-2:] == ["-m", "dynamo.frontend"]
    container = worker["extraPodSpec"]["mainContainer"]
    assert container["command"][-2:] == ["-m", "ocria.serving.dynamo_worker"]
    args = dynamo_worker.parser().parse_args(container["args"])  # the worker accepts its arguments
    assert args.device == "cuda" and args.model_name == "ocria"
    mounts = {m["mountPoint"]: m["name"] for m in worker["volumeMounts"]}
    assert any(str(args.engine).startswith(point + "/") for point in mounts)  # the engine is on a mounted volume
    assert set(mounts.values()) <= {p["name"] for p in doc["spec"]["pvcs"]}
    assert worker["resources"]["limits"]["gpu"] == "1" and worker["replicas"] >= 2
    for service in (frontend, worker):  # the operator's discovery: no etcd or NATS to run
        assert {"name": "DYN_DISCOVERY_BACKEND", "value": "kubernetes"} in service["envs"]
        assert service["extraPodSpec"]["mainContainer"]["image"] == container["image"]


def test_handler_serves_ocria_run_text_and_cancels_a_closed_stream(engine, run_json):
    """The worker's handler on its own (no Dynamo): the chunks, a bad image, and a client that goes away."""
    from ocria.runtime import load_engine
    from ocria.serving.engine_loop import EngineLoop, LoopObserver

    reasons = []

    class Finished(LoopObserver):
        def finished(self, stats, reason):
            reasons.append(reason)

    eng = load_engine(engine)
    loop = EngineLoop(eng, observer=Finished()).start()
    handler = ChatHandler(eng, loop, "ocria", ValueError)
    image = data_uri(EXAMPLE.read_bytes())

    async def scenario():
        chunks = [c async for c in handler.generate(chat(image, stream=True, **SAMPLING))]
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == run_json["text"]
        assert [i for c in chunks for i in c.get("nvext", {}).get("token_ids", [])] == run_json["token_ids"]
        whole = [c async for c in handler.generate(chat(image, **SAMPLING))]
        assert len(whole) == 2 and whole[0]["choices"][0]["delta"]["content"] == run_json["text"]
        assert whole[-1]["usage"]["completion_tokens"] == len(run_json["token_ids"])
        with pytest.raises(ValueError, match="image: not a readable image"):
            [c async for c in handler.generate(chat(data_uri(b"not an image")))]
        stream = handler.generate(chat(image, stream=True, temperature=2.0, seed=3, max_tokens=400))
        await stream.__anext__()
        await stream.aclose()  # what Dynamo does when the client disconnects

    try:
        asyncio.run(scenario())
        deadline = time.monotonic() + 10
        while len(reasons) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert reasons[:2] == [run_json["finish_reason"]] * 2 and reasons[2] == "cancelled"
    finally:
        loop.stop()
