"""``ocria bench scaling``: the deployments it plans for any number of GPUs, the comparison and its targets, and a
real run on CPU (one Dynamo worker against two), as the same command runs on a machine with several GPUs."""

import json
from pathlib import Path

import pytest

from ocria.bench.scaling import Deployment, compare, plan, serve_command
from ocria.cli import main
from ocria.errors import OcriaError
from ocria.serving.process import ServeProcess

EXAMPLE = Path(__file__).parent.parent / "examples" / "report.png"


def test_plan_serves_one_gpu_then_all_of_them_on_each_frontend():
    assert plan(["triton", "dynamo"], (0, 1)) == [Deployment("triton", (0,), 1), Deployment("triton", (0, 1), 2),
                                                   Deployment("dynamo", (0,), 1), Deployment("dynamo", (0, 1), 2)]
    assert plan(["dynamo"], (2, 3, 5, 7))[1] == Deployment("dynamo", (2, 3, 5, 7), 4)
    assert plan(["triton"], (0,)) == [Deployment("triton", (0,), 1)]  # one GPU: nothing to scale over
    # no GPU: Triton has one CPU engine instance; Dynamo compares one CPU worker with two
    assert plan(["triton", "dynamo"], ()) == [Deployment("triton", (), 1), Deployment("dynamo", (), 1),
                                              Deployment("dynamo", (), 2)]
    cmd = serve_command(Deployment("triton", (0, 1), 2), Path("e"), {"http": 1, "grpc": 2, "metrics": 3}, [])
    assert cmd[cmd.index("--gpus") + 1] == "0,1" and cmd[cmd.index("--device") + 1] == "gpu"
    cmd = serve_command(Deployment("dynamo", (), 2), Path("e"), {"http": 1, "grpc": 2, "metrics": 3}, ["--x"])
    assert cmd[cmd.index("--workers") + 1] == "2" and "--gpus" not in cmd and cmd[-1] == "--x"


def _result(points: list[tuple[int, float, int, dict | None]]) -> dict:
    return {"points": [{"concurrency": c, "requests_per_s": r, "output_tokens_per_s": 66 * r, "errors": e,
                        "served_by": None, "server": {"finished_by_instance": shares}}
                       for c, r, e, shares in points]}


def test_compare_checks_ratio_shares_and_errors():
    base = _result([(8, 100.0, 0, {"cuda:0 e_0_0": 800}), (64, 150.0, 0, {"cuda:0 e_0_0": 1500})])
    scaled = _result([(8, 150.0, 0, {"cuda:0 e_0_0": 700, "cuda:1 e_0_1": 800}),
                      (64, 280.0, 1, {"cuda:0 e_0_0": 1000, "cuda:1 e_0_1": 1800})])
    low, high = compare("triton", base, scaled, 2)
    assert low["ratio"] == pytest.approx(1.5) and "meets_ratio" not in low  # the target starts at 64 streams
    assert low["meets_shares"] and low["no_errors"]
    assert high["ratio"] == pytest.approx(280 / 150) and high["meets_ratio"]
    assert high["shares"] == pytest.approx({"cuda:0 e_0_0": 1000 / 2800, "cuda:1 e_0_1": 1800 / 2800})
    assert not high["meets_shares"] and not high["no_errors"]  # one GPU under 40%; one error


@pytest.fixture(scope="module")
def engine(mini_engine):
    return mini_engine


def test_scaling_on_cpu_compares_one_dynamo_worker_with_two(engine, tmp_path, capsys):
    out = tmp_path / "scaling"
    images = tmp_path / "images"
    images.mkdir()
    (images / "report.png").write_bytes(EXAMPLE.read_bytes())
    assert main(["bench", "scaling", "--engine", str(engine), "--frontends", "dynamo", "--concurrency", "4",
                 "--duration", "2", "--warmup", "0", "--max-tokens", "4", "--images", str(images),
                 "--out", str(out)]) == 0, capsys.readouterr().out
    summary = json.loads((out / "scaling.json").read_text())
    assert [d["name"] for d in summary["deployments"]] == ["dynamo_cpu_x1", "dynamo_cpu_x2"]
    (row,) = summary["comparison"]
    assert row["instances"] == 2 and row["no_errors"] and row["ratio"] > 0
    assert len(row["shares"]) == 2 and sum(row["shares"].values()) == pytest.approx(1.0)  # both workers served
    assert all((out / f"{d['name']}.json").is_file() for d in summary["deployments"])
    assert (out / "scaling.png").stat().st_size > 0
    assert "dynamo" in capsys.readouterr().out


@pytest.mark.parametrize("flags, message", [
    (["--gpus", "0,x"], "give GPU indices separated by commas"),
    (["--gpus", "1,1"], "must be distinct"),
])
def test_bad_gpus_and_engine_exit_2_with_one_line(engine, tmp_path, capsys, flags, message):
    assert main(["bench", "scaling", "--engine", str(engine), "--out", str(tmp_path / "o"), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert main(["bench", "scaling", "--engine", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "not an engine directory" in capsys.readouterr().err


def test_a_server_that_exits_before_ready_is_an_error_with_its_output(tmp_path):
    with pytest.raises(OcriaError, match=r"(?s)ocria serve exited \(code 2\):.*not an engine directory"):
        ServeProcess(["--engine", str(tmp_path)], ready_timeout_s=120)
