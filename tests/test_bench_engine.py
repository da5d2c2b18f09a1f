"""``ocria bench engine`` on CPU at small scale: the embedded ocria-mini engine, eager steps, the result JSON and plot,
and one-line errors for bad flags before anything loads."""

import json
import subprocess
import sys

import pytest
import torch

from ocria.cli import main
from ocria.data import generate

HEADER = ("benchmark", "command", "git", "time", "host", "device", "python", "torch")  # result_header's keys


@pytest.fixture(scope="module")
def mini(mini_engine):
    return mini_engine


@pytest.fixture(scope="module")
def small_page(tmp_path_factory):
    """A small page keeps the prompt short: on CPU the GDN layers run their token-by-token reference."""
    path = tmp_path_factory.mktemp("bench_page") / "page.png"
    generate(3, kind="page").image.resize((128, 96)).save(path)
    return path


def test_bench_engine_on_cpu_writes_rows_checks_and_plot(mini, small_page, tmp_path, capsys):
    out = tmp_path / "results" / "engine.json"
    rc = main(["bench", "engine", "--engine", str(mini), "--device", "cpu", "--batch", "1", "2",
               "--modes", "ar", "spec", "tau=4", "--tokens", "4", "--image", str(small_page), "--out", str(out)])
    stdout = capsys.readouterr().out
    assert rc == 0, stdout
    result = json.loads(out.read_text())
    assert tuple(result)[: len(HEADER)] == HEADER and result["benchmark"] == "engine"
    assert result["engine"] == str(mini) and result["device_type"] == "cpu" and result["timing"] == "eager_wall_clock"
    runs = result["runs"]
    assert [(r["batch"], r["mode"]) for r in runs] == [(b, m) for b in (1, 2) for m in ("ar", "spec", "tau=4")]
    assert all(r["tokens_per_s"] > 0 and r["step_ms"] > 0 and r["mean_acceptance_length"] >= 1 for r in runs)
    assert all(r["spec_equals_ar"] is (None if r["mode"] == "ar" else True) for r in runs)
    assert result["lossless_ok"] is True
    checks = [(c["batch"], c["mode"], c["ok"]) for c in result["table_checks"]]
    assert checks == [(1, "tau=4", True), (2, "tau=4", True)]
    forced = [r for r in runs if r["mode"] == "tau=4"]
    assert all(r["oracle_converged"] and r["oracle_passes"] >= 1 for r in forced)
    # GPU-only measurements are null on CPU, not made up
    assert result["copy_bandwidth_GBps"] is None and result["fp32_check"] is None
    first = result["prefill"]  # the offline time to first token; the graph replay and its check are CUDA's
    assert first["prompt_tokens"] == result["prompt_tokens"] and first["prepare_ms"] > 0
    assert first["prefill_graph_ms"] is None and first["graph_equals_eager"] is None
    assert first["ttft_offline_ms"] == first["prepare_ms"] + first["prefill_eager_ms"] + first["sample_ms"]
    assert all(r["launches"] is None and r["roofline_fraction"] is None and r["host_ms_per_step"] is None
               for r in runs)
    assert all(r["step_bytes"] > 0 for r in runs)
    png = out.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "spec==ar" in stdout and "tau=4" in stdout and "lossless: ok" in stdout


@pytest.mark.parametrize(("flags", "names"), [
    (["--modes", "ar", "tau=abc"], "tau=abc"),
    (["--modes", "ar", "fast"], "'fast'"),
    (["--batch", "1", "0"], "--batch 0"),
    (["--tokens", "0"], "--tokens 0"),
    (["--out", "result.txt"], "--out result.txt"),
])
def test_bad_flags_exit_2_with_one_line_before_loading(flags, names, tmp_path, capsys):
    out = tmp_path / "r.json"
    # an empty directory as the engine: the flags must fail before anything tries to load it
    rc = main(["bench", "engine", "--engine", str(tmp_path), "--device", "cpu", "--out", str(out), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and names in err[0], err
    assert err[0].startswith("ocria bench: error:")
    assert not out.exists()


def test_a_missing_engine_or_no_model_exits_2(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    assert main(["bench", "engine", "--engine", str(missing), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(missing) in err[0] and "not found" in err[0]
    assert main(["bench", "engine", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--engine" in err[0] and "--preset" in err[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_exits_2(tmp_path, capsys):
    assert main(["bench", "engine", "--engine", str(tmp_path), "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA GPU" in err[0]


def test_defining_the_flags_imports_no_torch():
    """``add_args`` runs whenever an ``ocria`` parser is built: the module's own imports stay light."""
    code = ("import argparse, sys; from ocria.bench import engine; engine.add_args(argparse.ArgumentParser()); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
