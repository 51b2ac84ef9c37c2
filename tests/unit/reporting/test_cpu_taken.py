"""What other processes and the hypervisor took of each rank's CPUs: the records' shares, the summary's window
after warm-up, and the lines at the end of a run."""

from __future__ import annotations

import pytest

from corecpu.cpu.contention import TAKEN, Taken
from corecpu.reporting.cpu_taken import MIN_COUNTED_S, TakenLog, cause, line


def test_each_record_has_the_interval_shares_and_the_summary_skips_the_first() -> None:
    log = TakenLog()
    # Running totals (others, steal, counted) of two ranks; rank 1's CPUs are not watched (counted 0).
    assert log.record([1.0, 0.0], [0.0, 0.0], [10.0, 0.0]) == {"rank_cpu_others": [0.1, None],
                                                               "rank_cpu_steal": [0.0, None]}
    assert log.summary() == {"rank_cpu_taken_after_warmup": None}  # warm-up only so far
    assert log.record([1.5, 0.0], [1.0, 0.0], [20.0, 0.0]) == {"rank_cpu_others": [0.05, None],
                                                               "rank_cpu_steal": [0.1, None]}
    assert log.record([6.5, 0.0], [1.0, 0.0], [30.0, 0.0]) == {"rank_cpu_others": [0.5, None],
                                                               "rank_cpu_steal": [0.0, None]}
    assert log.summary() == {"rank_cpu_taken_after_warmup": [{"others": 0.275, "steal": 0.05}, None]}
    assert log.taken() == {0: Taken(others=pytest.approx(0.275), steal=pytest.approx(0.05))}


def test_a_share_covers_at_least_min_counted_seconds_of_a_ranks_time() -> None:
    log = TakenLog()
    step = MIN_COUNTED_S * 0.34  # three records' worth of CPU time before a share says anything
    # The first record tells what it counted (the loop's warm-up); then rank 0 gets one tick of others (0.01 s) and
    # no more, rank 1 a tenth of its time throughout.
    records = [log.record([0.01 * (k > 1), 0.1 * step * k], [0.0, 0.0], [step * k, step * k]) for k in range(1, 8)]
    assert records[0]["rank_cpu_others"] == [0.0, pytest.approx(0.1)]
    assert records[1] == records[2] == {}  # nothing over enough time since: no keys
    assert records[3]["rank_cpu_others"] == [pytest.approx(0.01 / (3 * step), abs=1e-4), pytest.approx(0.1)]
    assert records[4] == records[5] == {}
    assert records[6]["rank_cpu_others"] == [0.0, pytest.approx(0.1)]  # since the last record that told
    # A rank that counts faster (more CPUs) tells more often, each on its own.
    mixed = TakenLog()
    mixed.record([0.0, 0.0], [0.0, 0.0], [0.1, 0.1])
    assert mixed.record([0.0, 0.0], [0.0, 0.0], [0.3, 1.1]) == {"rank_cpu_others": [None, 0.0],
                                                                "rank_cpu_steal": [None, 0.0]}


def test_nothing_is_recorded_where_no_rank_is_watched_and_quiet_cpus_are_not_taken() -> None:
    log = TakenLog()
    assert log.record([0.0], [0.0], [0.0]) == {}
    assert log.record([0.0], [0.0], [0.0]) == {}
    assert log.summary() == {"rank_cpu_taken_after_warmup": None} and log.taken() == {}
    quiet = TakenLog()
    for k in range(1, 4):
        quiet.record([0.02 * k, 0.0], [0.001 * k, 0.0], [10.0 * k, 10.0 * k])
    assert quiet.window is not None and quiet.taken() == {}
    stolen = TakenLog()
    for k in range(1, 4):
        stolen.record([0.0, 0.0], [0.0, TAKEN * 10.0 * k], [10.0 * k, 10.0 * k])
    assert list(stolen.taken()) == [1]


def test_the_cause_names_other_processes_the_hypervisor_or_the_cpus_themselves() -> None:
    assert cause(None) is None
    text = cause(Taken(others=0.49, steal=0.001))
    assert text is not None and text.startswith("other processes used 49% of its CPUs' time") and "steal" not in text
    text = cause(Taken(others=0.30, steal=0.05))
    assert text is not None and "and the hypervisor took 5% (steal)" in text
    text = cause(Taken(others=0.01, steal=0.30))
    assert text is not None and text.startswith("the hypervisor gave 30% of its CPUs' time to other guests (steal)")
    text = cause(Taken(others=0.004, steal=0.001))
    assert text is not None and text.startswith("nothing else ran on its CPUs (0.4% other processes, 0.1% steal)")


def test_the_line_lists_each_taken_rank_and_says_the_rate_was_kept_apart() -> None:
    assert line({}, ["0", "1"]) is None
    text = line({1: Taken(others=0.48, steal=0.0), 3: Taken(others=0.0, steal=0.2)}, ["0", "1", "2", "3"])
    assert text is not None and "\n" not in text
    assert "rank 1 (CPUs 1): other processes 48%; rank 3 (CPUs 3): the hypervisor 20% (steal) of their time" in text
    assert "keep it with the runs that started beside a busy neighbour, apart from idle starts" in text
