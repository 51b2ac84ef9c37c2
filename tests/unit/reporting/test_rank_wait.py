"""How long ranks waited for each other: shares of an interval, the summary's window, and a straggler named only
when every other rank kept waiting for it."""

from __future__ import annotations

import pytest

from corecpu.reporting import rank_wait
from corecpu.reporting.rank_wait import WaitLog, shares, straggler, straggler_line


def test_shares_are_the_interval_waits_over_its_length_clamped() -> None:
    assert shares([3.0, 1.5], [1.0, 1.0], 10.0) == pytest.approx([0.2, 0.05])
    assert shares([1.0, 30.0], [2.0, 0.0], 10.0) == [0.0, 1.0]  # a clock step back, or waits beyond the interval
    assert shares([1.0], [0.0], 0.0) == [0.0]


def test_jitter_names_nobody_and_a_rank_everyone_waits_for_is_named() -> None:
    assert straggler([0.05, 0.09]) is None  # both waited: jitter between the cores
    assert straggler([0.01, 0.08]) is None  # one-sided, but too little to be more than a slow stretch
    assert straggler([0.40, 0.01]) == 1
    assert straggler([0.30, 0.02, 0.35, 0.33]) == 1
    assert straggler([0.30, 0.02, 0.35, 0.10]) == 1  # rank 3 the next slowest, still far behind rank 1
    assert straggler([0.30, 0.02, 0.35, 0.03]) is None  # ranks 1 and 3 both slow: no one rank to name
    assert straggler([0.5]) is None


def test_the_line_names_the_rank_its_cpus_and_what_to_do() -> None:
    line = straggler_line([0.42, 0.01], ["0", "1"])
    assert line is not None
    assert line.startswith("rank 1 (CPUs 1) was the slow one: the other ranks spent 42% of the training time waiting")
    assert "./launch.sh auto" in line and "\n" not in line
    assert straggler_line([0.05, 0.06], ["0", "1"]) is None


def test_the_log_gives_each_interval_and_a_window_after_the_first() -> None:
    log = WaitLog(started=100.0)
    assert log.record(110.0, [1.0, 0.0]) == {"wait": 0.05, "rank_wait": [0.1, 0.0]}
    assert log.summary() == {"wait_after_warmup": None, "rank_wait_after_warmup": None}  # warm-up only so far
    assert log.record(120.0, [1.0, 4.0]) == {"wait": 0.2, "rank_wait": [0.0, 0.4]}
    assert log.record(130.0, [3.0, 4.0]) == {"wait": 0.1, "rank_wait": [0.2, 0.0]}
    assert log.summary() == {"wait_after_warmup": 0.15, "rank_wait_after_warmup": [0.1, 0.2]}


def test_a_straggler_needs_a_long_enough_window() -> None:
    log = WaitLog(started=0.0)
    waited = [0.0, 0.0]
    for k in range(1, rank_wait.STRAGGLER_INTERVALS + 2):
        waited = [waited[0] + 4.0, waited[1] + 0.1]  # rank 0 waits 40% of every interval for rank 1
        log.record(10.0 * k, waited)
        if k <= rank_wait.STRAGGLER_INTERVALS:
            assert log.straggler_line(["0", "1"]) is None, k
    line = log.straggler_line(["0", "1"])
    assert line is not None and line.startswith("rank 1 (CPUs 1) was the slow one")


def test_the_line_says_what_held_the_straggler_back_when_that_was_measured() -> None:
    line = straggler_line([0.42, 0.01], ["0", "1"], "other processes used 49% of its CPUs' time. Free them")
    assert line is not None
    assert "waiting for it; other processes used 49% of its CPUs' time. Free them, or run fewer ranks" in line
    assert "something else runs" not in line
    log = WaitLog(started=0.0)
    for k in range(1, rank_wait.STRAGGLER_INTERVALS + 2):
        log.record(10.0 * k, [4.0 * k, 0.1 * k])
    asked: list[int] = []
    line = log.straggler_line(["0", "1"], lambda r: asked.append(r) or "the cause. Do this")
    assert asked == [1] and line is not None and "; the cause. Do this, or run fewer ranks" in line
    assert log.straggler() == 1
