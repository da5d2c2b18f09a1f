"""End to end: `ocria serve` starts the real tritonserver (bundled in nvidia-pytriton) on CPU, loopback,
free ports; requests go through the `ocria` ensemble over gRPC with tritonclient."""

import io
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from servers import serving

from ocria.cli import main
from ocria.serving.client import Client, ServerError, _input, request_inputs
from ocria.serving.tritonserver import free_port

EXAMPLE = Path(__file__).parent.parent / "examples" / "report.png"
SAMPLING = dict(temperature=0.9, seed=7, max_tokens=24)


@pytest.fixture(scope="module")
def server(tmp_path_factory, mini_engine):
    tmp = tmp_path_factory.mktemp("serve")
    with serving(mini_engine, tmp / "tritonserver.log", "--max-batch", "8") as srv:
        yield srv


@pytest.fixture(scope="module")
def image() -> bytes:
    return EXAMPLE.read_bytes()


@pytest.fixture(scope="module")
def run_json(server) -> dict:
    """What `ocria run --json` prints for SAMPLING (run in a subprocess, as a user would)."""
    out = subprocess.run([sys.executable, "-m", "ocria.cli", "run", "--engine", str(server.engine), "--image",
                          str(EXAMPLE), "--json", "--temperature", str(SAMPLING["temperature"]), "--seed",
                          str(SAMPLING["seed"]), "--max-tokens", str(SAMPLING["max_tokens"])],
                         capture_output=True, text=True, check=True, timeout=300).stdout
    return json.loads(out)


@pytest.fixture(scope="module")
def expected(run_json) -> str:
    return run_json["text"]


def test_stream_and_non_stream_equal_ocria_run(server, image, expected, run_json):
    client = Client(server.url, timeout_s=120)
    chunks = list(client.generate(image, stream=True, return_perf_metrics=True, **SAMPLING))
    assert len(chunks) > 1 and all(not c.final for c in chunks[:-1]) and chunks[-1].final
    assert "".join(c.text for c in chunks) == expected
    assert [t for c in chunks for t in c.token_ids] == run_json["token_ids"]
    assert chunks[-1].finish_reason in ("length", "stop")
    perf = chunks[-1].perf
    assert set(perf) == {"acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens",
                         "first_token_time_ns", "last_token_time_ns"}
    assert perf["total_draft_tokens"] > 0 and 0 <= perf["acceptance_rate"] <= 1
    assert 0 < perf["first_token_time_ns"] <= perf["last_token_time_ns"]
    whole = list(client.generate(image, stream=False, **SAMPLING))
    assert len(whole) == 1 and whole[0].final and whole[0].text == expected and whole[0].perf == {}
    assert whole[0].token_ids == run_json["token_ids"]


def test_client_command_streams_and_prints_json(server, expected, run_json, capsys):
    args = ["client", "--url", server.url, "--image", str(EXAMPLE), "--temperature", "0.9", "--seed", "7",
            "--max-tokens", "24"]
    assert main(args + ["--stream"]) == 0
    assert capsys.readouterr().out == expected + "\n"
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["text"] == expected and out["total_draft_tokens"] > 0
    assert out["token_ids"] == run_json["token_ids"]  # the same tokens as `ocria run`
    assert main(args + ["--max-tokens", "0"]) == 2
    err = capsys.readouterr().err
    assert err == "ocria client: error: max_tokens must be a positive integer, got 0\n"
    assert main(["client", "--url", f"127.0.0.1:{free_port()}", "--image", str(EXAMPLE)]) == 2
    assert "cannot reach a Triton server at 127.0.0.1:" in capsys.readouterr().err


def test_32_concurrent_streams_each_get_their_own_output(server, image):
    client = Client(server.url, timeout_s=120)

    # temperature 4: the trained ocria-mini is confident, and at 0.9 most seeds read the page alike
    def run(seed: int) -> tuple[str, bool]:
        chunks = list(client.generate(image, stream=True, temperature=4.0, seed=seed, max_tokens=12))
        return "".join(c.text for c in chunks), chunks[-1].final

    alone = [run(seed) for seed in range(32)]
    batches_before = server.metrics()
    with ThreadPoolExecutor(32) as pool:
        together = list(pool.map(run, range(32)))
    assert together == alone and all(final for _, final in alone)
    assert len({text for text, _ in alone}) > 16  # different seeds, different texts: no cross-talk
    after = server.metrics()
    key = 'ocria_batch_size_bucket{model="ocria_engine",le="1"}'
    count = 'ocria_batch_size_count{model="ocria_engine"}'
    steps_with_more_than_one = (after[count] - after[key]) - (batches_before[count] - batches_before[key])
    assert steps_with_more_than_one > 0
    assert after['ocria_requests_in_flight{model="ocria_engine"}'] == 0
    for stage in ("prefill", "decode"):  # where the engine loop's time went, for ocria bench serve
        busy = f'ocria_engine_busy_seconds_total{{model="ocria_engine",stage="{stage}"}}'
        assert after[busy] > batches_before.get(busy, 0.0)


@pytest.mark.parametrize("stream", [True, False])
def test_cancel_mid_stream_frees_the_slot(server, image, stream):
    client = Client(server.url, timeout_s=120)
    reason = 'ocria_requests_finished_total{model="ocria_engine",reason="cancelled"}'
    before = server.metrics()[reason]
    if stream:  # the client leaves after two chunks: the generator cancels its stream
        gen = client.generate(image, stream=True, temperature=0.9, seed=11, max_tokens=800)
        next(gen)
        next(gen)
        gen.close()
    else:  # nothing streams back: cancel while the engine is generating
        import tritonclient.grpc as grpcclient

        raw = grpcclient.InferenceServerClient(server.url)
        raw.start_stream(callback=lambda result, error: None)
        raw.async_stream_infer("ocria", request_inputs(image, stream=False, temperature=0.9, seed=11,
                                                       max_tokens=800))
        generated = 'ocria_generated_tokens_total{model="ocria_engine"}'
        tokens_before = server.metrics()[generated]
        deadline = time.monotonic() + 30
        while server.metrics()[generated] == tokens_before:  # cancel as soon as it is generating: the trained
            assert time.monotonic() < deadline  # drafter writes 800 tokens in well under a second on CPU
            time.sleep(0.01)
        raw.stop_stream(cancel_requests=True)
        raw.close()
    deadline = time.monotonic() + 10
    while True:
        m = server.metrics()
        if m[reason] == before + 1 and m['ocria_requests_in_flight{model="ocria_engine"}'] == 0:
            break
        assert time.monotonic() < deadline, m
        time.sleep(0.05)
    assert server.http("/v2/models/ocria/ready") == 200
    assert Client(server.url).complete(image, max_tokens=4).final


def _png(width: int, height: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), "white").save(buf, format="PNG")
    return buf.getvalue()


def _raw(**overrides):
    """Good inputs with some replaced (value None: removed)."""
    inputs = {i.name(): i for i in request_inputs(EXAMPLE.read_bytes(), max_tokens=4)}
    for name, value in overrides.items():
        inputs.pop(name, None)
        if value is not None:
            inputs[name] = value
    return list(inputs.values())


def _png_header(width: int, height: int) -> bytes:
    """A PNG that declares ``width`` x ``height`` pixels and holds none (what a decompression bomb looks like to a
    decoder that trusts headers)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)) + \
        chunk(b"IEND", b"")


BAD_INPUTS = {
    "corrupt image": (dict(image=EXAMPLE.read_bytes()[:200]), "not a readable image"),
    "not an image": (dict(image=b"%PDF-1.4 hello"), "not a readable image"),
    "very thin image": (dict(image=_png(4, 5000)), "a 4x5000 image cannot be read as a page"),
    "huge declared image": (dict(image=_png_header(100_000, 100_000)), "decompression bomb"),
    "empty image": (dict(raw=_raw(image_bytes_input=_input("image_bytes_input", np.zeros((1, 0), np.uint8), "UINT8"))),
                    "image is empty"),
    "max_tokens 0": (dict(max_tokens=0), "max_tokens must be a positive integer, got 0"),
    "max_tokens too large": (dict(max_tokens=100000), "max_tokens=100000 is beyond"),
    "temperature < 0": (dict(temperature=-0.5), "temperature must be a finite number >= 0, got -0.5"),
    "top_p 0": (dict(top_p=0.0), "top_p must be in (0, 1], got 0.0"),
    "top_p > 1": (dict(top_p=1.5), "top_p must be in (0, 1], got 1.5"),
    "missing image": (dict(raw=_raw(image_bytes_input=None)), "image_bytes_input"),
    "wrong dtype": (dict(raw=_raw(max_tokens=_input("max_tokens", np.array([[4.0]], np.float32), "FP32"))),
                    "max_tokens"),
    "batch of 2": (dict(raw=_raw(image_bytes_input=_input("image_bytes_input", np.zeros((2, 8), np.uint8),
                                                          "UINT8"))), "batch size"),
    "wrong shape": (dict(raw=_raw(max_tokens=_input("max_tokens", np.array([[4, 4]], np.int32), "INT32"))),
                    "max_tokens"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_refused_and_the_server_stays_ready(server, image, case):
    kwargs, message = BAD_INPUTS[case]
    client = Client(server.url, timeout_s=60)
    raw = kwargs.pop("raw", None)
    with pytest.raises(ServerError) as err:
        if raw is not None:
            list(client.stream(raw))
        else:
            list(client.generate(kwargs.pop("image", image), **{"max_tokens": 4, **kwargs}))
    text = str(err.value)
    assert message in text
    assert "\n" not in text and len(text) < 500  # one line (Triton's own shape/dtype messages are long)
    assert server.http("/v2/health/ready") == 200 and server.http("/v2/models/ocria/ready") == 200
    assert client.complete(image, max_tokens=3).final


# Every scalar input of the ensemble at its extremes, over gRPC: a value is served (a final response) or refused
# with one line naming the input (by our checks, or by Triton's for a dtype or shape its config does not declare),
# and the server stays ready. The finer sweep of the parsing itself is in test_serving_repo.
EXTREMES = [
    ("seed", np.array([[2**64 - 1]], np.uint64), "UINT64", None),
    ("seed", np.array([[2**63]], np.uint64), "UINT64", None),
    ("seed", np.array([[-1]], np.int64), "INT64", "seed"),
    ("max_tokens", np.array([[-(2**31)]], np.int32), "INT32", "max_tokens must be a positive integer"),
    ("max_tokens", np.array([[2**31 - 1]], np.int32), "INT32", "max_tokens=2147483647 is beyond"),
    ("max_tokens", np.array([[4, 4]], np.int32), "INT32", "max_tokens"),
    ("temperature", np.array([[np.nan]], np.float32), "FP32", "temperature must be a finite number"),
    ("temperature", np.array([[np.inf]], np.float32), "FP32", "temperature must be a finite number"),
    ("temperature", np.array([[3e38]], np.float32), "FP32", None),
    ("top_p", np.array([[np.nan]], np.float32), "FP32", "top_p must be a finite number"),
    ("top_p", np.array([[-np.inf]], np.float32), "FP32", "top_p must be a finite number"),
    ("top_k", np.array([[2**31 - 1]], np.int32), "INT32", None),
    ("top_k", np.array([[-7]], np.int32), "INT32", "top_k must be >= 0"),
    ("end_id", np.array([[2**31 - 1]], np.int32), "INT32", "outside the vocabulary"),
    ("end_id", np.array([[-1]], np.int32), "INT32", None),
    ("stop_words", np.array([[b"x" * 300]], np.object_), "BYTES", "stop_words: a string of 300 bytes"),
    ("text_input", np.array([[b"\xff\xfe"]], np.object_), "BYTES", "text_input: not valid UTF-8"),
    ("text_input", np.array([[b"word " * 1000]], np.object_), "BYTES", "the prompt is"),
    ("stream", np.array([[1]], np.int32), "INT32", "stream"),
]


@pytest.mark.parametrize("name,value,dtype,refused", EXTREMES,
                         ids=[f"{n}-{i}" for i, (n, *_) in enumerate(EXTREMES)])
def test_every_input_extreme_is_served_or_refused_in_one_line(server, image, name, value, dtype, refused):
    client = Client(server.url, timeout_s=60)
    raw = _raw(**{name: _input(name, value, dtype)})
    if refused is None:
        assert list(client.stream(raw))[-1].final
    else:
        with pytest.raises(ServerError) as err:
            list(client.stream(raw))
        text = str(err.value)
        assert refused in text and "\n" not in text and len(text) < 500, text
    assert server.http("/v2/health/ready") == 200 and server.http("/v2/models/ocria/ready") == 200


def test_clients_cannot_manage_models(server, image):
    """The model-repository API is restricted: an unload from any client is refused and the server stays up."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    request = urllib.request.Request(f"http://127.0.0.1:{server.ports.http}/v2/repository/models/ocria_engine/unload",
                                     method="POST", data=b"{}")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=5)
    assert err.value.code == 403
    raw = grpcclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException, match="restricted|PERMISSION|permission"):
        raw.unload_model("ocria_engine")
    with pytest.raises(InferenceServerException, match="restricted|PERMISSION|permission"):
        raw.get_model_repository_index()
    raw.close()
    assert server.http("/v2/models/ocria/ready") == 200 and server.proc.poll() is None
    assert Client(server.url).complete(image, max_tokens=3).final


def test_inconsistent_engine_inputs_fail_alone(server, image):
    """Direct requests to the engine model are checked before they reach the shared loop."""
    client = Client(server.url, timeout_s=60)
    ids = _input("input_ids", np.array([[1, 99999]], np.int64), "INT64")
    pixels = _input("pixel_bytes", np.zeros((1, 4, 1536), np.uint8), "UINT8")
    grid = _input("image_grid_thw", np.array([[1, 2, 2]], np.int64), "INT64")
    with pytest.raises(ServerError, match=r"input_ids outside the vocabulary \[0, 512\)"):
        list(client.stream([ids, pixels, grid], model="ocria_engine"))
    ids = _input("input_ids", np.array([[1, 2]], np.int64), "INT64")
    with pytest.raises(ServerError, match="image tokens in input_ids do not match|number of image tokens"):
        list(client.stream([ids, pixels, grid], model="ocria_engine"))
    wide = _input("pixel_bytes", np.zeros((1, 4, 1535), np.uint8), "UINT8")
    with pytest.raises(ServerError, match=r"pixel_bytes \[4, 1535\] do not match image_grid_thw"):
        list(client.stream([ids, wide, grid], model="ocria_engine"))
    assert server.http("/v2/models/ocria_engine/ready") == 200
    assert client.complete(image, max_tokens=3).final


def test_metrics_after_requests(server, image):
    before = server.metrics()
    Client(server.url).complete(image, max_tokens=6, temperature=0.9, seed=1)
    m = server.metrics()
    lab = '{model="ocria_engine"}'
    assert m[f"ocria_generated_tokens_total{lab}"] - before[f"ocria_generated_tokens_total{lab}"] == 6
    assert m[f"ocria_draft_tokens_proposed_total{lab}"] > before[f"ocria_draft_tokens_proposed_total{lab}"]
    assert m[f"ocria_draft_tokens_accepted_total{lab}"] <= m[f"ocria_draft_tokens_proposed_total{lab}"]
    assert m[f"ocria_requests_in_flight{lab}"] == 0
    for hist in ("ocria_time_to_first_token_seconds", "ocria_inter_token_latency_seconds", "ocria_acceptance_length"):
        assert m[f"{hist}_count{lab}"] > before.get(f"{hist}_count{lab}", 0)
        assert m[f"{hist}_sum{lab}"] > 0
    ttft_mean = m[f"ocria_time_to_first_token_seconds_sum{lab}"] / m[f"ocria_time_to_first_token_seconds_count{lab}"]
    assert 0 < ttft_mean < 60
    assert m['ocria_time_to_first_token_seconds_bucket{model="ocria_engine",le="+Inf"}'] == \
        m[f"ocria_time_to_first_token_seconds_count{lab}"]
    # each series names its engine instance and device: with an instance per GPU, each GPU's share shows
    labelled = [k for k in server.metrics(instance_labels=True) if k.startswith("ocria_generated_tokens_total")]
    assert len(labelled) == 1 and 'instance="ocria_engine_0_0"' in labelled[0] and 'device="cpu"' in labelled[0], \
        labelled


def test_sigterm_stops_the_server_cleanly(server):
    pid = server.triton_pid()
    assert pid is not None
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(60) == 0
    assert any("tritonserver stopped (exit code 0)" in line for line in server.lines)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
