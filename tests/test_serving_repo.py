"""Model repository generation and validation, request parsing, and the engine loop (no server)."""

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from ocria.cli import build_main
from ocria.errors import ConfigError, OcriaError, RequestError
from ocria.runtime import SamplingParams, load_engine
from ocria.serving import protocol
from ocria.serving.engine_loop import EngineLoop, EngineUnavailable
from ocria.serving.repo import RepoOptions, parse_config, validate_repo, write_repo

EXAMPLE = Path(__file__).parent.parent / "examples" / "report.png"


@pytest.fixture(scope="module")
def engine_dir(mini_engine):
    return mini_engine


@pytest.fixture(scope="module")
def engine(engine_dir):
    return load_engine(engine_dir)


def test_triton_repo_command_writes_a_valid_repository(tmp_path, engine_dir, capsys):
    out = tmp_path / "repo"
    assert build_main(["triton-repo", "--engine", str(engine_dir), "--out", str(out), "--max-batch", "4",
                       "--instances", "2"]) == 0
    assert "ocria_engine    python decoupled max_batch_size=4" in capsys.readouterr().out
    configs = validate_repo(out)
    assert set(configs) == {"ocria", "preprocessing", "ocria_engine", "postprocessing"}
    assert all((out / name / "1").is_dir() for name in configs)
    assert configs["preprocessing"].instance_group[0].count == 2
    assert configs["ocria_engine"].instance_group[0].count == 1  # one shared batching loop
    engine_params = {k: v.string_value for k, v in configs["ocria_engine"].parameters.items()}
    assert engine_params["engine_dir"] == str(engine_dir.resolve()) and engine_params["device"] == "cpu"
    assert engine_params["cancellation_check_period_ms"] == "100"
    inputs = {t.name for t in configs["ocria"].input}
    assert {"text_input", "image_bytes_input", "max_tokens", "stream", "temperature", "top_k", "top_p", "seed",
            "end_id", "stop_words", "return_perf_metrics"} == inputs
    assert {t.name for t in configs["ocria"].output} >= set(protocol.PERF_OUTPUTS) | {"text_output"}
    assert [p.name for p in tmp_path.iterdir()] == ["repo"]  # no temporary left behind
    assert build_main(["triton-repo", "--engine", str(engine_dir), "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err


def test_gpu_device_and_missing_engine(tmp_path, engine_dir, capsys):
    out = write_repo(tmp_path / "g", RepoOptions(engine_dir, device="gpu"))
    cfg = validate_repo(out)["ocria_engine"]
    assert cfg.instance_group[0].kind == cfg.instance_group[0].KIND_GPU
    assert cfg.parameters["device"].string_value == "cuda"
    assert build_main(["triton-repo", "--engine", str(tmp_path / "nope"), "--out", str(tmp_path / "r")]) == 2
    assert "not an engine directory" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_leftover_placeholder_and_bad_wiring_are_refused(tmp_path, engine_dir):
    out = write_repo(tmp_path / "repo", RepoOptions(engine_dir))
    cfg = out / "preprocessing" / "config.pbtxt"
    good = cfg.read_text()
    cfg.write_text(good.replace('string_value: "', 'string_value: "${engine_dir}', 1))
    with pytest.raises(ConfigError, match=r"unfilled placeholder.*\$\{engine_dir\}"):
        validate_repo(out)
    cfg.write_text(good.replace("max_batch_size:", "max_batch_size: [", 1))
    with pytest.raises(ConfigError, match="not a valid Triton model config"):
        parse_config(cfg)
    cfg.write_text(good)
    ens = out / "ocria" / "config.pbtxt"
    ens.write_text(ens.read_text().replace('value: "_pixel_bytes" }\n      input_map', 'value: "_nowhere" }\n'
                                                                                     '      input_map', 1))
    with pytest.raises(ConfigError, match="'_nowhere' feeds ocria_engine.pixel_bytes before it exists"):
        validate_repo(out)


def test_request_parsing():
    def getter(**arrays):
        return lambda name: arrays.get(name)

    def t(values, dtype):  # numeric inputs arrive as torch tensors (DLPack), STRING ones as NumPy object arrays
        return torch.tensor(values, dtype=dtype)

    params, given = protocol.sampling_params(getter(
        max_tokens=t([[7]], torch.int32), temperature=t([[0.5]], torch.float32),
        seed=t([[9]], torch.uint64), end_id=t([[2]], torch.int32),
        stop_words=np.array([[b"##", b"END"]], np.object_)))
    assert given and (params.max_tokens, params.temperature, params.seed) == (7, 0.5, 9)
    assert params.stop == ("##", "END") and params.stop_token_ids == (2,)
    assert protocol.sampling_params(getter())[1] is False
    image = torch.frombuffer(bytearray(b"\x89PNG"), dtype=torch.uint8)[None]
    assert protocol.image_bytes(getter(image_bytes_input=image)) == b"\x89PNG"
    with pytest.raises(RequestError, match="image_bytes_input is missing"):
        protocol.image_bytes(getter())
    with pytest.raises(RequestError, match="batch size 2"):
        protocol.image_bytes(getter(image_bytes_input=torch.zeros(2, 4, dtype=torch.uint8)))
    with pytest.raises(RequestError, match="max_tokens: wrong dtype float32"):
        protocol.sampling_params(getter(max_tokens=t([[1.0]], torch.float32)))
    with pytest.raises(RequestError, match="text_input: not valid UTF-8"):
        protocol.prompt_text(getter(text_input=np.array([[b"\xff"]], np.object_)))


# Every input of the ocria ensemble at its extremes, as the engine model's parsing sees them: each value is
# accepted (with the value the engine uses) or refused with a one-line RequestError naming the input.
U64 = torch.uint64
EXTREMES = [
    ("seed", torch.tensor([[2**64 - 1]], dtype=U64), "ok"),
    ("seed", torch.tensor([[2**63]], dtype=U64), "ok"),
    ("seed", torch.tensor([[0]], dtype=U64), "ok"),
    ("seed", torch.tensor([[-1]], dtype=torch.int64), "ok"),
    ("seed", torch.tensor([[1.5]], dtype=torch.float32), "seed: wrong dtype float32"),
    ("max_tokens", torch.tensor([[-(2**31)]], dtype=torch.int32), "max_tokens must be a positive integer"),
    ("max_tokens", torch.tensor([[0]], dtype=torch.int32), "max_tokens must be a positive integer"),
    ("max_tokens", torch.tensor([[2**31 - 1]], dtype=torch.int32), "ok"),  # the engine checks it against its length
    ("max_tokens", torch.tensor([[4, 4]], dtype=torch.int32), "max_tokens: expected one value"),
    ("max_tokens", torch.zeros(1, 0, dtype=torch.int32), "max_tokens: expected one value"),
    ("max_tokens", torch.tensor([[True]]), "max_tokens: wrong dtype bool"),
    ("temperature", torch.tensor([[float("nan")]]), "temperature must be a finite number"),
    ("temperature", torch.tensor([[float("inf")]]), "temperature must be a finite number"),
    ("temperature", torch.tensor([[-1e-30]]), "temperature must be a finite number >= 0"),
    ("temperature", torch.tensor([[3e38]]), "ok"),
    ("top_p", torch.tensor([[float("nan")]]), "top_p must be a finite number"),
    ("top_p", torch.tensor([[0.0]]), "top_p must be in (0, 1]"),
    ("top_p", torch.tensor([[1.0000001]]), "top_p must be in (0, 1]"),
    ("top_k", torch.tensor([[-1]], dtype=torch.int32), "top_k must be >= 0"),
    ("top_k", torch.tensor([[2**31 - 1]], dtype=torch.int32), "ok"),
    ("end_id", torch.tensor([[-5]], dtype=torch.int32), "ok"),  # negative: no end id
    ("stop_words", np.array([[b""]], np.object_), "stop strings must not be empty"),
    ("stop_words", np.array([[b"x"] * 33], np.object_), "stop_words: 33 strings, at most 32"),
    ("stop_words", np.array([[b"x" * 257]], np.object_), "stop_words: a string of 257 bytes"),
    ("stop_words", np.array([[b"\xc3"]], np.object_), "stop_words: not valid UTF-8"),
    ("stop_words", np.zeros((1, 0), np.object_), "ok"),
    ("stream", torch.tensor([[1]], dtype=torch.int32), "stream: wrong dtype int32"),
    ("return_perf_metrics", torch.tensor([[True, False]]), "return_perf_metrics: expected one value"),
]


@pytest.mark.parametrize("name,value,want", EXTREMES, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(EXTREMES)])
def test_every_input_extreme_is_accepted_or_refused_in_one_line(name, value, want):
    get = {name: value}.get
    if want == "ok":
        params, _ = protocol.sampling_params(get)
        protocol.flag(get, "stream")
        protocol.flag(get, "return_perf_metrics")
        if name == "seed":  # any 64-bit pattern is one seed, whichever way it is written
            assert -(2**63) <= params.seed64 < 2**63
        return
    with pytest.raises(RequestError) as err:
        protocol.sampling_params(get)
        protocol.flag(get, "stream")
        protocol.flag(get, "return_perf_metrics")
    assert want in str(err.value) and "\n" not in str(err.value)


def test_text_input_extremes():
    get = {"text_input": np.array([[b"x" * (64 * 1024 + 1)]], np.object_)}.get
    with pytest.raises(RequestError, match="text_input: a string of 65537 bytes"):
        protocol.prompt_text(get)
    assert protocol.prompt_text({"text_input": np.array([[b""]], np.object_)}.get) is None
    with pytest.raises(RequestError, match="text_input: 2 strings, at most 1"):
        protocol.prompt_text({"text_input": np.array([[b"a", b"b"]], np.object_)}.get)
    with pytest.raises(RequestError, match="text_input: wrong dtype uint8, expected STRING"):
        protocol.prompt_text({"text_input": torch.zeros(1, 3, dtype=torch.uint8)}.get)


def _collect(loop, engine, seeds, max_tokens=10, cancel_after=None):
    done, results = threading.Event(), {}
    prompt = engine.processor.prepare(EXAMPLE)
    keys = {}

    def sink_for(seed):
        def sink(event, error):
            results.setdefault(seed, []).append(error if error else event)
            if error or event.finished:
                if len(results) == len(seeds) and all(
                        isinstance(r[-1], OcriaError) or r[-1].finished for r in results.values()):
                    done.set()
            elif cancel_after is not None and len(results[seed]) == cancel_after:
                loop.cancel(keys[seed])
        return sink

    for seed in seeds:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.9, seed=seed)
        keys[seed] = loop.new_key()
        loop.submit(prompt, params, sink_for(seed), key=keys[seed])
    assert done.wait(120)
    return results


def test_engine_loop_batches_and_matches_single_requests(engine):
    loop = EngineLoop(engine, max_batch_size=4).start()
    try:
        together = _collect(loop, engine, range(6))
        assert loop.max_batch_seen == 4
        for seed in (0, 5):
            alone = list(engine.generate(EXAMPLE, None, SamplingParams(max_tokens=10, temperature=0.9, seed=seed)))
            assert "".join(e.text for e in together[seed]) == "".join(e.text for e in alone)
            assert [t for e in together[seed] for t in e.token_ids] == [t for e in alone for t in e.token_ids]
        cancelled = _collect(loop, engine, [1], max_tokens=200, cancel_after=2)[1]
        assert cancelled[-1].finish_reason == "cancelled" and len(cancelled) <= 4
        assert loop.scheduler.num_running == 0 and len(loop.scheduler.free) == 4
    finally:
        loop.stop()
    assert not loop.alive


def test_engine_loop_polls_is_cancelled_within_the_period(engine):
    loop = EngineLoop(engine, max_batch_size=2, cancel_period_s=0.05).start()
    flag, events = threading.Event(), []
    try:
        params = SamplingParams(max_tokens=500, temperature=0.9, seed=4, ignore_eos=True)
        loop.submit(engine.processor.prepare(EXAMPLE), params, lambda e, err: events.append(e or err), flag.is_set)
        while not events:
            time.sleep(0.01)
        flag.set()
        t0 = time.perf_counter()
        while not (events and getattr(events[-1], "finished", False)):
            assert time.perf_counter() - t0 < 10
            time.sleep(0.01)
        assert events[-1].finish_reason == "cancelled"
        assert loop.scheduler.num_running == 0
    finally:
        loop.stop()


def test_dead_loop_fails_open_requests_and_refuses_new_ones(engine):
    deaths = []
    loop = EngineLoop(engine, max_batch_size=2, on_death=deaths.append).start()
    prompt = engine.processor.prepare(EXAMPLE)
    errors = []
    started = threading.Event()

    def broken_step():
        started.wait(10)
        raise RuntimeError("device lost")

    loop.scheduler.step = broken_step
    loop.submit(prompt, SamplingParams(max_tokens=5), lambda e, err: errors.append(err))
    started.set()
    loop._thread.join(10)
    assert [str(e) for e in errors] == ["engine loop died: RuntimeError: device lost"]
    assert isinstance(errors[0], EngineUnavailable)
    assert deaths == ["RuntimeError: device lost"] and not loop.alive
    with pytest.raises(OcriaError, match="engine loop is not running: RuntimeError: device lost"):
        loop.submit(prompt, SamplingParams(max_tokens=5), lambda e, err: None)


def test_bundled_server_environment(tmp_path):
    import os
    import sys
    import sysconfig

    from ocria.serving.tritonserver import Ports, backend_directory, find_server, server_env

    install = find_server()
    assert install.binary.is_file() and os.access(install.binary, os.X_OK)
    env = server_env(install, {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/opt/x"})
    ld = env["LD_LIBRARY_PATH"].split(":")
    assert ld[0] == sysconfig.get_config_var("LIBDIR") and ld[-1] == "/opt/x"
    assert any(p.endswith("nvidia_pytriton.libs") for p in ld)
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)
    assert env["PYTHONPATH"].split(":")[0] == str(Path(__file__).resolve().parent.parent)
    python = backend_directory(install, tmp_path / "b") / "python"
    assert {"libtriton_python.so", "triton_python_backend_stub"} <= {p.name for p in python.iterdir()}
    ports = Ports.free()
    assert len({ports.grpc, ports.http, ports.metrics}) == 3
    assert install.needs_numpy1  # tritonserver 2.51's stub: ocria serve gives it NumPy < 2 (stub_env)
    stub_python = Path(sys.executable).parent
    assert server_env(install, {"PATH": "/usr/bin"}, stub_python)["PATH"].split(":")[0] == str(stub_python)


def test_explicit_server_binary_needs_a_python_backend(tmp_path):
    from ocria.serving.tritonserver import find_server

    with pytest.raises(OcriaError, match="tritonserver binary not found"):
        find_server(tmp_path / "bin" / "tritonserver")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "tritonserver").write_text("")
    (tmp_path / "backends" / "python").mkdir(parents=True)
    (tmp_path / "backends" / "python" / "libtriton_python.so").write_text("")
    with pytest.raises(OcriaError, match="no Python backend triton_python_backend_stub"):
        find_server(tmp_path / "bin" / "tritonserver")
    (tmp_path / "backends" / "python" / "triton_python_backend_stub").write_text("")
    install = find_server(tmp_path / "bin" / "tritonserver")
    assert install.stub is None and install.python_backend == tmp_path / "backends" / "python"


def test_serving_commands_are_listed_and_name_a_missing_dependency(tmp_path):
    """serve/client/bench are always commands; without the serve extra they say what to install (one line)."""
    import subprocess
    import sys

    listed = subprocess.run([sys.executable, "-m", "ocria.cli", "--help"], capture_output=True, text=True)
    assert all(name in listed.stdout for name in ("run", "serve", "client", "bench"))
    hide = "import sys; sys.modules['tritonclient'] = None; sys.modules['pytriton'] = None; from ocria.cli import main"
    for command in (["serve", "--engine", str(tmp_path)], ["client", "--image", str(EXAMPLE)]):
        out = subprocess.run([sys.executable, "-c", f"{hide}; sys.exit(main({command!r}))"], capture_output=True,
                             text=True)
        assert out.returncode == 2 and out.stdout == "", out.stderr
        err = out.stderr.strip()
        assert "\n" not in err and "needs the Python package 'tritonclient'" in err
        assert "pip install 'ocria[serve]'" in err


def test_stub_environment_names_the_package_that_cannot_import(tmp_path, monkeypatch):
    """A package of the environment that breaks under the stub's NumPy < 2 is named, with its root cause, before
    the server starts (not behind transformers' lazy-import message in the server log)."""
    from ocria.serving.stub_env import check_imports, overlay

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    broken = tmp_path / "first"
    (broken / "transformers").mkdir(parents=True)
    (broken / "transformers" / "__init__.py").write_text(
        "try:\n    raise ValueError('numpy.dtype size changed: built against NumPy 2')\n"
        "except ValueError as e:\n    raise ImportError('transformers failed') from e\n")
    python = overlay(broken) / "python3"
    with pytest.raises(OcriaError) as err:
        check_imports(python)
    text = str(err.value)
    assert "\n" not in text and "from transformers import" in text
    assert "ValueError: numpy.dtype size changed: built against NumPy 2" in text
    check_imports(overlay(tmp_path / "empty") / "python3")  # this environment imports everything
