"""A study's progress line: its estimate of the time left counts the runs that train side by side."""

from __future__ import annotations

import io

import pytest

from vitlab.experiments import runs


@pytest.mark.parametrize("slots, left", [(1, "40.0 min"), (2, "24.0 min"), (3, "16.0 min"), (8, "8.0 min")])
def test_the_time_left_is_rounds_of_parallel_runs_times_a_runs_mean_time(monkeypatch, slots, left):
    clock = iter([0.0, 0.0, 480.0, 480.0])  # start, begin, end (an 8-minute run), elapsed
    monkeypatch.setattr(runs.time, "perf_counter", lambda: next(clock))
    out = io.StringIO()
    meter = runs.Progress(6, "depth study", stream=out, slots=slots)
    meter.end("vit_depth6_seed1", meter.begin("vit_depth6_seed1"), "test accuracy 86.00%")
    # 5 runs left: 5 rounds of one worker, 3 of two, 2 of three, 1 of eight
    assert out.getvalue().splitlines()[-1].endswith(f"(elapsed 8.0 min, about {left} left)")


def test_a_read_back_run_leaves_no_estimate_until_one_is_trained():
    out = io.StringIO()
    meter = runs.Progress(3, "depth study", stream=out, slots=2)
    meter.end("vit_depth6_seed0", None, "test accuracy 86.00%")
    assert "read back" in out.getvalue() and "left)" not in out.getvalue()
