"""bench/replay_ssm_ws_probe.py is GPU only; on CPU it must refuse clearly, and bad configs before anything runs."""

import sys

import pytest
from bench_scripts import load_bench


@pytest.mark.parametrize("text", ["1x2", "1x6x2x48", "0x6x2x64", "1x6xtwox64"])
def test_a_bad_config_is_refused_by_name(text):
    with pytest.raises(SystemExit, match=f"--configs '{text}'"):
        load_bench("replay_ssm_ws_probe").parse_config(text)


def test_a_good_config_parses():
    assert load_bench("replay_ssm_ws_probe").parse_config("1x6x2x64") == (1, 6, 2, 64)


def test_without_a_gpu_it_says_so(monkeypatch, tmp_path):
    probe = load_bench("replay_ssm_ws_probe")
    monkeypatch.setattr(probe.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "argv", ["replay_ssm_ws_probe.py", "--out", str(tmp_path / "x.json")])
    with pytest.raises(SystemExit, match="none is visible"):
        probe.main()
    assert not (tmp_path / "x.json").exists()
