"""The benchmarks' one timing and report helper: medians, the first call, alternation, memory readers.

Timings run on a fake clock (each call of the timed function advances it by a known amount), so the
figures are exact; nothing here asserts how fast anything is.
"""

import json
import mmap
import os

import numpy as np

from benchmarks.report import (
    RssSampler,
    alternating_medians,
    emit,
    peak_rss_mb,
    ratio,
    resident_mb,
    stdout_to_stderr,
    timed,
    timed_call,
)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def costing(self, *seconds: float):
        """A function whose n-th call takes ``seconds[n]`` on this clock and returns n."""
        calls = iter(enumerate(seconds))

        def run():
            n, cost = next(calls)
            self.now += cost
            return n

        return run


def test_timed_gives_the_median_the_first_call_and_the_last_result():
    clock = FakeClock()
    timing = timed(clock.costing(5.0, 1.0, 3.0), repeats=3, clock=clock)
    assert (timing.median_s, timing.first_s, timing.result) == (3.0, 5.0, 2)


def test_a_warm_up_call_is_left_out_of_the_timing():
    clock = FakeClock()
    timing = timed(clock.costing(100.0, 2.0, 4.0), repeats=2, warm_up=True, clock=clock)
    assert (timing.median_s, timing.first_s, timing.result) == (3.0, 2.0, 2)


def test_timed_call_returns_the_seconds_and_the_result():
    clock = FakeClock()
    assert timed_call(clock.costing(0.25), clock) == (0.25, 0)


def test_alternating_medians_swap_the_order_every_repeat():
    clock, order = FakeClock(), []

    def first():
        order.append("first")
        clock.now += 1.0

    def second():
        order.append("second")
        clock.now += 3.0

    assert alternating_medians(first, second, repeats=3, clock=clock) == (1.0, 3.0)
    assert order == ["first", "second", "second", "first", "first", "second"]


def test_ratio_has_four_significant_digits_and_no_baseline_gives_none():
    assert ratio(2.0, 3.0) == 0.6667
    assert ratio(1.0, 0.0) is None


def test_the_rss_sampler_sees_a_block_allocate_and_the_peak_covers_it():
    with RssSampler(interval_s=0.005) as rss:
        # Fresh anonymous pages: a numpy array here could reuse heap pages this worker already holds.
        block = mmap.mmap(-1, 32 * 2**20)
        np.frombuffer(block, np.uint8)[:] = 1  # every page touched
    assert rss.added_mb > 16
    assert peak_rss_mb() >= rss.peak_mb - 1  # the high-water mark covers what the sampler saw
    assert resident_mb() > 0


def test_emit_prints_one_json_line_and_stdout_to_stderr_keeps_the_rest_off_stdout(capfd):
    with stdout_to_stderr():
        os.write(1, b"a library talking\n")  # as C code or a child process writes: to the descriptor
    emit("example", {"n": 1}, {"figure": 2.5})
    out, err = capfd.readouterr()
    assert "a library talking" in err
    [line] = out.splitlines()
    record = json.loads(line)
    assert (record["benchmark"], record["params"], record["figure"]) == ("example", {"n": 1}, 2.5)
    assert set(record["machine"]) == {"cpus", "python", "platform"}
