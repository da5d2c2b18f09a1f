"""The stamp probes (bench/replay_ssm_timeline.py, bench/silu_quant_timeline.py) are GPU only: their refusals and
their stamp patches are checked here, their stamp arithmetic in their own test files."""

import subprocess
import sys
from pathlib import Path

import pytest
from bench_scripts import load_bench

ROOT = Path(__file__).resolve().parent.parent
PROBES = [("replay_ssm_timeline", "--hopper"), ("silu_quant_timeline", "--kernel")]


@pytest.mark.parametrize(("name", "flag"), PROBES)
def test_a_missing_stamped_copy_is_named(monkeypatch, tmp_path, name, flag):
    probe = load_bench(name)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", flag, str(tmp_path / "none.py"), "--out", str(tmp_path / "x.json")])
    with pytest.raises(SystemExit, match="none.py: no such file"):
        probe.main()


@pytest.mark.parametrize(("name", "flag"), PROBES)
def test_without_a_gpu_it_says_so(monkeypatch, tmp_path, name, flag):
    probe = load_bench(name)
    copy = tmp_path / "stamped.py"
    copy.write_text("")
    monkeypatch.setattr(probe.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", flag, str(copy), "--out", str(tmp_path / "x.json")])
    with pytest.raises(SystemExit, match="none is visible"):
        probe.main()
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("name", [name for name, _ in PROBES])
def test_the_stamp_patch_applies_to_the_kernel_file(name):
    """A probe is only as good as its stamped copy: a kernel change that leaves the patch behind fails here."""
    check = subprocess.run(["git", "apply", "--check", load_bench(name).STAMP_PATCH], cwd=ROOT, capture_output=True,
                           text=True)  # fmt: skip
    assert check.returncode == 0, check.stderr
