"""bench/replay_ssm_timeline.py's stamp arithmetic (its refusals and patch: test_bench_stamp_probes.py)."""

import pytest
from bench_scripts import load_bench


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

