"""bench/silu_quant_timeline.py's stamp arithmetic (its refusals and patch: test_bench_stamp_probes.py)."""

import sys

import pytest
import torch
from bench_scripts import load_bench


def stamps() -> torch.Tensor:
    """Two programs of two warps, two stamped tiles each (ns): warp (1, 1) does one tile and ends last."""
    s = torch.zeros(2, 2, 5, dtype=torch.int64)
    t0 = 1_000_000
    for p in range(2):
        for w in range(2):
            s[p, w, 0] = t0 + 100 * (p + w)  # starts
            s[p, w, 1:5] = torch.tensor([500, 1500, 1600, 2600]) + t0
    s[1, 1, 1:3] = torch.tensor([500, 4500]) + t0
    s[1, 1, 3:5] = 0
    return s


def test_stamps_become_microseconds_from_the_first_warp():
    times = load_bench("silu_quant_timeline").warp_times(stamps())
    assert times["tiles"] == [1, 2]
    assert times["first_data"] == [0.5] * 5
    assert times["last_data"][0] == 0.5 and times["last_data"][-1] == 1.6  # warp (1, 1)'s last tile is its first
    assert times["last_end"][-1] == 4.5 and times["last_tile"][-1] == 4.0
    assert times["tile"][0] == 1.0
    assert times["end_by_program_eighth"] == [2.6, 3.55]  # fewer programs than eighths: one group each
    assert times["end_by_warp"] == [2.6, 3.55]



@pytest.mark.parametrize("blocks", ["0", "48", "2048"])
def test_a_tiling_the_kernel_cannot_launch_is_refused(monkeypatch, tmp_path, blocks):
    copy = tmp_path / "silu_tl.py"
    copy.write_text("")
    argv = ["silu_quant_timeline.py", "--kernel", str(copy), "--max-blocks", blocks, "--out", str(tmp_path / "x.json")]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match=f"--max-blocks {blocks}: use a power of two"):
        load_bench("silu_quant_timeline").main()
