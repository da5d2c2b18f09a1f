"""bench/timing.py's choice of graph length: enough calls that a replay's own launch is a small part of it."""

from bench_scripts import load_bench


def test_a_graph_holds_min_calls_when_nothing_is_timed_yet():
    assert load_bench("timing").graph_reps(11, 20) == 2  # 22 calls


def test_short_calls_get_enough_rounds_for_the_graph_time():
    timing = load_bench("timing")
    reps = timing.graph_reps(11, 20, per_call_us=10.0, min_graph_us=2000.0)
    assert reps == 19 and 11 * reps * 10.0 >= 2000.0 > 11 * (reps - 1) * 10.0


def test_long_calls_keep_min_calls():
    assert load_bench("timing").graph_reps(11, 20, per_call_us=500.0, min_graph_us=2000.0) == 2


def test_tiny_calls_stop_near_the_call_cap():
    timing = load_bench("timing")
    reps = timing.graph_reps(11, 20, per_call_us=0.01, min_graph_us=2000.0)
    assert timing.MAX_CALLS <= 11 * reps < timing.MAX_CALLS + 11
