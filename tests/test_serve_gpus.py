"""`--gpus`: one engine instance per listed GPU in the Triton repository (instance_group), and a one-line refusal
where the machine lacks those GPUs (checked before any server starts)."""

import pytest
import torch

from ocria.cli import build_main, main
from ocria.errors import OcriaError
from ocria.serving.repo import RepoOptions, validate_repo, write_repo


@pytest.fixture(scope="module")
def engine_dir(mini_engine):
    return mini_engine


def test_gpus_put_one_engine_instance_on_each_gpu(tmp_path, engine_dir, capsys):
    out = tmp_path / "repo"
    assert build_main(["triton-repo", "--engine", str(engine_dir), "--out", str(out), "--gpus", "0,1,3"]) == 0
    configs = validate_repo(out)
    group = configs["ocria_engine"].instance_group
    assert len(group) == 1 and group[0].count == 1 and group[0].kind == group[0].KIND_GPU
    assert list(group[0].gpus) == [0, 1, 3]
    assert configs["ocria_engine"].parameters["device"].string_value == "cuda"
    assert configs["preprocessing"].instance_group[0].kind == group[0].KIND_CPU  # image decoding stays on CPUs
    default = validate_repo(write_repo(tmp_path / "any", RepoOptions(engine_dir, device="gpu")))["ocria_engine"]
    assert list(default.instance_group[0].gpus) == []  # without --gpus, Triton picks


@pytest.mark.parametrize("value", ["0,0", "a", "-1", ""])
def test_bad_gpu_lists_are_refused_by_the_parser(engine_dir, tmp_path, capsys, value):
    with pytest.raises(SystemExit) as e:
        build_main(["triton-repo", "--engine", str(engine_dir), "--out", str(tmp_path / "r"), "--gpus", value])
    assert e.value.code == 2
    assert f"expected distinct GPU indices like 0,1, got {value!r}" in capsys.readouterr().err


def test_repo_options_refuse_gpus_on_cpu(engine_dir, tmp_path):
    with pytest.raises(OcriaError, match=r"--gpus needs --device gpu"):
        write_repo(tmp_path / "r", RepoOptions(engine_dir, device="cpu", gpus=(0,)))
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("frontend", ["triton", "dynamo"])
def test_serve_with_gpus_the_machine_lacks_exits_2_with_one_line(engine_dir, monkeypatch, capsys, frontend):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    args = ["serve", "--engine", str(engine_dir), "--frontend", frontend, "--gpus", "0,1"]
    assert main(args) == 2
    assert capsys.readouterr().err == ("ocria serve: error: --gpus 0,1: this machine has no CUDA GPU; serve on CPU "
                                       "without --gpus\n")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert main(args) == 2
    assert capsys.readouterr().err == ("ocria serve: error: --gpus 0,1: this machine has 1 CUDA GPU(s), indices 0 "
                                       "to 0\n")


def test_workers_is_a_dynamo_flag(engine_dir, capsys):
    assert main(["serve", "--engine", str(engine_dir), "--workers", "2"]) == 2
    assert "--workers is for --frontend dynamo" in capsys.readouterr().err
