"""`ocria bench serve`: its pure parts (Prometheus parsing and diffs, percentiles, the Poisson schedule, timing a
request, the closed and open loops) against fakes, then one sweep against a real `ocria serve` (tritonserver on CPU)."""

import itertools
import json
import shutil
import time
from pathlib import Path

import pytest
from servers import serving

from ocria.bench.serve import (
    Driver,
    Load,
    RequestParams,
    RequestSample,
    Window,
    counter_delta,
    format_table,
    histogram_mean,
    measure_request,
    metrics_url,
    parse_prometheus,
    point_result,
    poisson_arrivals,
    server_stats,
    summarize,
)
from ocria.cli import main
from ocria.errors import OcriaError

EXAMPLE = Path(__file__).parent.parent / "examples" / "report.png"

BEFORE = """\
# HELP ocria_requests_finished_total Finished requests by finish reason
# TYPE ocria_requests_finished_total counter
ocria_requests_finished_total{model="ocria_engine",reason="error"} 0
ocria_requests_finished_total{model="ocria_engine",reason="length"} 3
ocria_requests_finished_total{model="ocria_engine",reason="stop"} 1
ocria_generated_tokens_total{model="ocria_engine"} 40
ocria_batch_size_count{model="ocria_engine"} 10
ocria_batch_size_sum{model="ocria_engine"} 10
ocria_batch_size_bucket{model="ocria_engine",le="1"} 10
ocria_batch_size_bucket{model="ocria_engine",le="+Inf"} 10
ocria_time_to_first_token_seconds_count{model="ocria_engine"} 4
ocria_time_to_first_token_seconds_sum{model="ocria_engine"} 0.8
nv_inference_count{model="ocria",version="1"} 4
ocria_engine_busy_seconds_total{model="ocria_engine",stage="prefill"} 1.0
ocria_engine_busy_seconds_total{model="ocria_engine",stage="decode"} 2.0
nv_inference_request_success{model="preprocessing",version="1"} 4
nv_inference_compute_infer_duration_us{model="preprocessing",version="1"} 40000
nv_inference_queue_duration_us{model="preprocessing",version="1"} 400
"""

AFTER = """\
# HELP ocria_requests_finished_total Finished requests by finish reason
ocria_requests_finished_total{model="ocria_engine",reason="error"} 1
ocria_requests_finished_total{model="ocria_engine",reason="length"} 9
ocria_requests_finished_total{model="ocria_engine",reason="stop"} 1
ocria_generated_tokens_total{model="ocria_engine"} 1.6e+02
ocria_batch_size_count{model="ocria_engine"} 20
ocria_batch_size_sum{model="ocria_engine"} 40
ocria_batch_size_bucket{model="ocria_engine",le="1"} 12
ocria_batch_size_bucket{model="ocria_engine",le="+Inf"} 20
ocria_time_to_first_token_seconds_count{model="ocria_engine"} 10
ocria_time_to_first_token_seconds_sum{model="ocria_engine"} 2.0
ocria_acceptance_length_count{model="ocria_engine"} 0
ocria_acceptance_length_sum{model="ocria_engine"} 0
nv_inference_count{model="ocria",version="1"} 10 1700000000000
ocria_engine_busy_seconds_total{model="ocria_engine",stage="prefill"} 4.0
ocria_engine_busy_seconds_total{model="ocria_engine",stage="decode"} 3.0
nv_inference_request_success{model="preprocessing",version="1"} 14
nv_inference_compute_infer_duration_us{model="preprocessing",version="1"} 190000
nv_inference_queue_duration_us{model="preprocessing",version="1"} 5400
a_line that does not parse
"""


# --- Prometheus text ------------------------------------------------------------------------------------------


def test_parse_prometheus_reads_labels_values_and_skips_the_rest():
    s = parse_prometheus(AFTER)
    assert s.total("ocria_generated_tokens_total") == 160.0
    assert s.total("ocria_requests_finished_total") == 11
    assert s.total("ocria_requests_finished_total", reason="length") == 9
    assert s.total("ocria_batch_size_bucket", le="+Inf") == 20
    assert s.total("nv_inference_count", model="ocria") == 10  # a trailing timestamp is not the value
    assert s.total("ocria_not_exported") is None
    assert "a_line" not in s.series
    quoted = parse_prometheus('m{path="a,b=\\"c\\"",x="1"} 2.5\n')
    assert quoted.series["m"] == [({"path": 'a,b="c"', "x": "1"}, 2.5)]


def test_diff_of_counters_and_histogram_means():
    before, after = parse_prometheus(BEFORE), parse_prometheus(AFTER)
    assert counter_delta(before, after, "ocria_generated_tokens_total") == 120
    assert counter_delta(before, after, "ocria_requests_finished_total", reason="length") == 6
    assert counter_delta(after, before, "ocria_generated_tokens_total") is None  # went back: a restart
    assert histogram_mean(before, after, "ocria_batch_size") == pytest.approx(3.0)  # (40-10) / (20-10)
    assert histogram_mean(before, after, "ocria_time_to_first_token_seconds") == pytest.approx(0.2)
    stats = server_stats(before, after)
    assert stats.generated_tokens == 120
    assert stats.mean_batch_size == pytest.approx(3.0)
    assert stats.mean_ttft_s == pytest.approx(0.2)
    assert stats.finished == {"error": 1, "length": 6, "stop": 0}
    # families missing from either scrape, or with no new observations, are null rather than zero
    assert stats.mean_acceptance_length is None  # only in `after`
    assert stats.mean_inter_token_s is None and stats.draft_tokens_proposed is None
    assert stats.engine_busy is None  # no window length given
    timed = server_stats(before, after, wall_s=4.0)
    assert timed.engine_busy == pytest.approx({"prefill": 0.75, "decode": 0.25})  # (4-1)/4, (3-2)/4
    assert timed.preprocess_ms == pytest.approx(15.0) and timed.preprocess_queue_ms == pytest.approx(0.5)
    empty = server_stats(parse_prometheus(""), parse_prometheus(""))
    assert empty.generated_tokens is None and empty.mean_batch_size is None and empty.finished is None
    assert empty.engine_busy is None and empty.preprocess_ms is None


def test_finished_requests_per_engine_instance():
    """A server with an engine instance per GPU labels each instance's series: the sweep reports each one's share."""
    def scrape(a: int, b: int) -> str:
        return (f'ocria_requests_finished_total{{model="e",instance="e_0_0",device="cuda:0",reason="stop"}} {a}\n'
                f'ocria_requests_finished_total{{model="e",instance="e_0_1",device="cuda:1",reason="stop"}} {b}\n'
                f'ocria_requests_finished_total{{model="e",instance="e_0_1",device="cuda:1",reason="length"}} 1\n')
    stats = server_stats(parse_prometheus(scrape(2, 3)), parse_prometheus(scrape(12, 10)))
    assert stats.finished == {"length": 0, "stop": 17}
    assert stats.finished_by_instance == {"cuda:0 e_0_0": 10, "cuda:1 e_0_1": 7}
    assert server_stats(parse_prometheus(BEFORE), parse_prometheus(AFTER)).finished_by_instance is None


def test_metrics_url_defaults_to_port_8002_of_the_grpc_host():
    assert metrics_url("10.0.0.5:8001", None) == "http://10.0.0.5:8002/metrics"
    assert metrics_url("h:1", "h:9") == "http://h:9/metrics"
    assert metrics_url("h:1", "https://h:9/custom") == "https://h:9/custom"


# --- summaries and schedules ----------------------------------------------------------------------------------


def test_percentiles_interpolate_linearly():
    s = summarize([float(x) for x in range(100, 0, -1)])  # 1..100, any order
    assert (s.p50, s.p90, s.p99, s.mean) == pytest.approx((50.5, 90.1, 99.01, 50.5))
    one = summarize([0.25])
    assert (one.p50, one.p90, one.p99, one.mean) == (0.25, 0.25, 0.25, 0.25)
    assert summarize([]) is None


def test_poisson_schedule_is_seeded_and_has_mean_gap_one_over_rate():
    a = list(itertools.islice(poisson_arrivals(4.0, seed=1), 20000))
    assert a == list(itertools.islice(poisson_arrivals(4.0, seed=1), 20000))
    assert a != list(itertools.islice(poisson_arrivals(4.0, seed=2), 20000))
    assert all(x < y for x, y in zip(a, a[1:]))
    assert a[-1] / len(a) == pytest.approx(0.25, rel=0.03)


# --- timing requests with a fake backend ----------------------------------------------------------------------


class Reply:
    def __init__(self, text, token_ids=(), finish_reason=None):
        self.text, self.token_ids, self.finish_reason = text, list(token_ids), finish_reason


class ScriptedBackend:
    """Yields scripted replies, setting a fake clock to each reply's time first."""

    name = "scripted"

    def __init__(self, script, clock, fail_after=None):
        self.script, self.clock, self.fail_after = script, clock, fail_after

    def check(self):
        pass

    def send(self, image, params, seed):
        for i, (t, reply) in enumerate(self.script):
            if i == self.fail_after:
                raise OcriaError("engine exploded")
            self.clock[0] = t
            yield reply


def _measure(script, fail_after=None) -> RequestSample:
    clock = [0.0]
    return measure_request(ScriptedBackend(script, clock, fail_after), b"img", RequestParams(), 0,
                           clock=lambda: clock[0])


def test_request_timing_counts_token_ids_and_inter_token_latency():
    s = _measure([(0.1, Reply("ab", [1, 2])), (0.3, Reply("")),  # an empty response is no chunk
                  (0.5, Reply("cdef", [3, 4, 5, 6])), (0.6, Reply("", [], "length"))])
    assert s.error is None and s.finish_reason == "length"
    assert s.ttft_s == pytest.approx(0.1) and s.latency_s == pytest.approx(0.6)
    assert s.tokens == 6
    assert s.itl_s == pytest.approx([0.1])  # (0.5 - 0.1) / 4 tokens


def test_request_without_token_ids_has_null_tokens_not_an_estimate():
    s = _measure([(0.2, Reply("## Title")), (0.4, Reply(" more", [], "stop"))])
    assert s.tokens is None and s.itl_s == [] and s.ttft_s == pytest.approx(0.2)
    p = point_result(Load(concurrency=1), None, [s], measure_start=0.0, now=1.0, server=None)
    assert p.output_tokens is None and p.output_tokens_per_s is None and p.mean_tokens_per_request is None
    assert p.completed == 1 and p.requests_per_s == pytest.approx(1 / 0.4)


def test_failed_request_is_an_error_sample():
    s = _measure([(0.1, Reply("a", [1])), (0.2, Reply("b", [2]))], fail_after=1)
    assert s.error == "engine exploded"
    p = point_result(Load(concurrency=1), None, [s, s], measure_start=0.0, now=1.0, server=None)
    assert (p.completed, p.errors, p.error_messages) == (0, 2, ["engine exploded"])
    assert p.ttft_s is None and p.requests_per_s == 0
    assert "c=1" in format_table([p]).splitlines()[1]


class RecordingBackend:
    """Answers at once; fails every request whose seed is a multiple of 4; records (image, seed)."""

    name = "recording"
    seen: list = []

    def check(self):
        pass

    def send(self, image, params, seed):
        self.seen.append((image, seed))
        if seed % 4 == 0:
            raise OcriaError(f"seed {seed} refused")
        yield Reply("x", [seed], "length")


@pytest.mark.parametrize("load", [Load(concurrency=3), Load(request_rate=500.0)])
def test_loops_send_the_requested_count_cycle_images_and_keep_going_after_errors(load):
    RecordingBackend.seen = []
    window = Window(warmup_s=0.0, duration_s=None, requests=10)
    driver = Driver(RecordingBackend, [b"a", b"b"], RequestParams(), seed=5, window=window)
    driver.start(load, max_concurrency=4)
    samples = driver.join()
    assert len(samples) == 10 and len(RecordingBackend.seen) == 10
    assert sorted(seed for _, seed in RecordingBackend.seen) == list(range(5, 15))
    assert all(image == [b"a", b"b"][(seed - 5) % 2] for image, seed in RecordingBackend.seen)
    p = point_result(load, None, samples, window.measure_start, time.perf_counter(), None)
    assert (p.completed, p.errors) == (8, 2)  # seeds 8 and 12
    assert p.output_tokens == 8 and p.mean_tokens_per_request == 1
    assert sorted(p.error_messages) == ["seed 12 refused", "seed 8 refused"]


class SleepyBackend:
    name = "sleepy"
    sent = 0

    def check(self):
        pass

    def send(self, image, params, seed):
        SleepyBackend.sent += 1
        time.sleep(0.02)
        yield Reply("x")


def test_warmup_requests_are_sent_but_not_counted():
    SleepyBackend.sent = 0
    window = Window(warmup_s=0.2, duration_s=0.2, requests=None)
    driver = Driver(SleepyBackend, [b"a"], RequestParams(), 0, window)
    driver.start(Load(concurrency=2), 1)
    samples = driver.join()
    assert 0 < len(samples) < SleepyBackend.sent
    assert all(window.measure_start <= s.start < window.deadline + 0.05 for s in samples)


# --- flags and inputs -----------------------------------------------------------------------------------------


@pytest.fixture
def images(tmp_path) -> Path:
    d = tmp_path / "images"
    d.mkdir()
    shutil.copy(EXAMPLE, d / "report.png")
    return d


@pytest.mark.parametrize("flags, message", [
    (["--concurrency", "1", "0"], "--concurrency must be >= 1, got 0"),
    (["--request-rate", "0"], "--request-rate must be a finite number > 0, got 0"),
    (["--duration", "0"], "--duration must be > 0, got 0"),
])
def test_bad_flags_exit_2_with_one_line(images, capsys, flags, message):
    assert main(["bench", "serve", "--images", str(images), *flags]) == 2
    assert capsys.readouterr().err == f"ocria bench: error: {message}\n"


def test_empty_images_dir_and_unreachable_server_exit_2_with_one_line(images, tmp_path, capsys):
    from ocria.serving.tritonserver import free_port

    (tmp_path / "empty").mkdir()
    assert main(["bench", "serve", "--images", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--images {tmp_path / 'empty'}: no images" in err
    url = f"127.0.0.1:{free_port()}"
    assert main(["bench", "serve", "--url", url, "--images", str(images)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot reach a Triton server at {url}" in err


# --- end to end against `ocria serve` -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory, mini_engine):
    """`ocria serve` on free loopback ports; yields its Ports."""
    tmp = tmp_path_factory.mktemp("bench-serve")
    with serving(mini_engine, tmp / "tritonserver.log", "--max-batch", "8") as srv:
        yield srv.ports


def test_sweep_against_a_real_server(server, images, tmp_path, capsys):
    out = tmp_path / "b.json"
    rc = main(["bench", "serve", "--url", f"127.0.0.1:{server.grpc}", "--metrics-url",
               f"http://127.0.0.1:{server.metrics}/metrics", "--images", str(images), "--concurrency", "1", "2",
               "--duration", "3", "--warmup", "0", "--max-tokens", "8", "--out", str(out)])
    stdout = capsys.readouterr().out
    assert rc == 0, stdout
    result = json.loads(out.read_text())
    assert result["benchmark"] == "serve" and result["sweep"] == "concurrency"
    assert result["args"]["params"]["max_tokens"] == 8
    points = result["points"]
    assert [p["concurrency"] for p in points] == [1, 2]
    for p in points:
        assert p["completed"] > 0 and p["errors"] == 0 and p["error_messages"] == []
        assert p["requests_per_s"] > 0
        assert p["ttft_s"]["p50"] > 0 and p["latency_s"]["p99"] >= p["latency_s"]["p50"] >= p["ttft_s"]["p50"]
        server_side = p["server"]
        assert server_side["mean_batch_size"] is not None and server_side["mean_batch_size"] >= 1
        assert server_side["mean_ttft_s"] > 0
        # every counted request started and ended between the two scrapes, and no other request ran
        assert sum(server_side["finished"].values()) == p["completed"]
        assert list(server_side["finished_by_instance"].values()) == [p["completed"]]  # one engine instance
        assert 0 < server_side["generated_tokens"] <= 8 * p["completed"]
        # the client counts tokens only from token ids; once the server sends them, the counts must agree
        assert p["output_tokens"] is None or p["output_tokens"] == server_side["generated_tokens"]
    assert out.with_suffix(".png").stat().st_size > 0
    table = stdout[stdout.index("load"):].splitlines()
    assert [row.split()[0] for row in table[1:3]] == ["c=1", "c=2"]
