"""``ocria.bench.timing``'s choice of graph length (enough calls that a replay's own launch is a small part of it)
and its rotating outputs."""

import gc
import weakref

from ocria.bench import timing


def test_a_graph_holds_min_calls_when_nothing_is_timed_yet():
    assert timing.graph_reps(11, 20) == 2  # 22 calls


def test_short_calls_get_enough_rounds_for_the_graph_time():
    reps = timing.graph_reps(11, 20, per_call_us=10.0, min_graph_us=2000.0)
    assert reps == 19 and 11 * reps * 10.0 >= 2000.0 > 11 * (reps - 1) * 10.0


def test_long_calls_keep_min_calls():
    assert timing.graph_reps(11, 20, per_call_us=500.0, min_graph_us=2000.0) == 2


def test_tiny_calls_stop_near_the_call_cap():
    reps = timing.graph_reps(11, 20, per_call_us=0.01, min_graph_us=2000.0)
    assert timing.MAX_CALLS <= 11 * reps < timing.MAX_CALLS + 11


def test_rotating_calls_keep_each_output_until_that_input_comes_round_again():
    """A call's output must stay allocated through the other inputs' calls (a graph's pool would otherwise give the
    next call the same buffer) and be released by its own input's next call."""
    made = []

    class Out:
        def __init__(self, x):
            self.x = x
            made.append(weakref.ref(self))

    inputs = ["a", "b", "c"]
    calls = timing.rotating_calls(Out, inputs)
    for call in calls:
        call()
    gc.collect()
    assert [r().x for r in made] == inputs  # all three alive at once, each from its own input
    calls[1]()
    gc.collect()
    assert [r() is not None for r in made] == [True, False, True, True] and made[3]().x == "b"
