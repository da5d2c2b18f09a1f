"""bench/replay_ssm_timeline.py is GPU only: its stamp arithmetic and its refusals are checked here."""

import subprocess
import sys
from pathlib import Path

import pytest
from bench_scripts import load_bench

ROOT = Path(__file__).resolve().parent.parent


def stamps(per_ns: float) -> list[int]:
    """A CTA's 128 stamps: consumer 0 starts at clock 1000 and its first tile's chunks arrive 2 µs later."""
    s = [0] * 128
    s[0] = s[40] = s[80] = s[88] = s[96] = 1000
    s[2] = 1000 + int(1000 * per_ns)  # tile 0 starts after 1 µs
    s[3] = 1000 + int(3000 * per_ns)
    s[124], s[125] = 1000, 1000 + int(10_000 * per_ns)  # clocks beside 10 µs of globaltimer
    s[126], s[127] = 5_000, 15_000
    return s


def test_cycles_become_microseconds_from_the_cta_start():
    cta = load_bench("replay_ssm_timeline").cta_times(stamps(per_ns=1.8))
    assert cta["ghz"] == pytest.approx(1.8)
    assert cta["c0"]["start"] == 0.0
    assert cta["c0"]["tiles"] == [[1.0, 3.0, None, None, None]]
    assert cta["c1"]["tiles"] == []  # no stamps, no tiles


def test_a_probes_spare_stamps_come_back_by_index():
    s = stamps(per_ns=2.0)
    s[107] = 1000 + int(4000 * 2.0)  # a scratch copy's own stamp, 4 µs after the CTA's start
    cta = load_bench("replay_ssm_timeline").cta_times(s)
    assert cta["spare"] == {107: 4.0}  # unwritten spare stamps are left out


def test_a_missing_stamped_copy_is_named(monkeypatch, tmp_path):
    probe = load_bench("replay_ssm_timeline")
    monkeypatch.setattr(sys, "argv", ["replay_ssm_timeline.py", "--hopper", str(tmp_path / "none.py"),
                                      "--out", str(tmp_path / "x.json")])  # fmt: skip
    with pytest.raises(SystemExit, match="none.py: no such file"):
        probe.main()


def test_without_a_gpu_it_says_so(monkeypatch, tmp_path):
    probe = load_bench("replay_ssm_timeline")
    copy = tmp_path / "hopper_tl.py"
    copy.write_text("")
    monkeypatch.setattr(probe.torch.cuda, "is_available", lambda: False)
    argv = ["replay_ssm_timeline.py", "--hopper", str(copy), "--out", str(tmp_path / "x.json")]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match="none is visible"):
        probe.main()
    assert not (tmp_path / "x.json").exists()


def test_the_stamp_patch_applies_to_the_kernel_file():
    """The probe is only as good as its stamped copy: a kernel change that leaves the patch behind fails here."""
    patch = load_bench("replay_ssm_timeline").STAMP_PATCH
    check = subprocess.run(["git", "apply", "--check", patch], cwd=ROOT, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
