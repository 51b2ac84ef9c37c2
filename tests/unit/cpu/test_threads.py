"""Tier 1: how many threads a rank gets, and why (corecpu.cpu.threads)."""

from __future__ import annotations

import os

import pytest

from corecpu.cluster.launchers import LaunchInfo
from corecpu.cpu.threads import decide_threads
from corecpu.errors import CoreCPUError

ALL = frozenset(range(8))
TWO_LOCAL = LaunchInfo("torchrun", 1, 2, 1, 2)


def test_threads_respect_an_explicit_request():
    d = decide_threads(3, {}, ALL, ALL, TWO_LOCAL, frozenset({4, 5, 6, 7}))
    assert (d.threads, d.bind_to) == (3, None)


def test_threads_when_bound_by_corecpu():
    d = decide_threads(0, {"CORECPU_BOUND_CPUS": "4-7", "OMP_NUM_THREADS": "4"}, frozenset({4, 5, 6, 7}), ALL,
                       TWO_LOCAL, None)
    assert (d.threads, d.bind_to) == (4, None)


def test_threads_respect_a_launcher_binding():
    # ipexrun / Intel MPI already narrowed this rank to 2 CPUs: use them, do not re-plan.
    d = decide_threads(0, {"OMP_NUM_THREADS": "1"}, frozenset({2, 3}), ALL, TWO_LOCAL, frozenset({4, 5, 6, 7}))
    assert (d.threads, d.bind_to) == (2, None)


def test_unbound_torchrun_ranks_get_their_planned_share():
    # torchrun sets OMP_NUM_THREADS=1 and binds nothing: every rank would see all 8 CPUs.
    d = decide_threads(0, {"OMP_NUM_THREADS": "1"}, ALL, ALL, TWO_LOCAL, frozenset({4, 5, 6, 7}))
    assert (d.threads, d.bind_to) == (4, frozenset({4, 5, 6, 7}))
    fallback = decide_threads(0, {}, ALL, ALL, TWO_LOCAL, None)
    assert (fallback.threads, fallback.bind_to) == (4, None)


def test_single_rank_uses_everything_it_may():
    d = decide_threads(0, {}, ALL, ALL, LaunchInfo("single", 0, 1, 0, 1), None)
    assert d.threads == 8


def test_configure_threads_writes_the_environment_it_is_given():
    # setup(env=...) promises injection: the decision goes into that mapping, not the process's.
    import os

    import torch

    from corecpu.cpu.threads import DECISION_VAR, configure_threads

    env: dict[str, str] = {}
    threads = torch.get_num_threads()  # an explicit request: no binding, torch's pool keeps its size
    d = configure_threads(LaunchInfo("single", 0, 1, 0, 1), threads, frozenset(os.sched_getaffinity(0)), env=env)
    assert env == {"OMP_NUM_THREADS": str(threads), DECISION_VAR: "--threads"} and d.threads == threads



@pytest.mark.parametrize("value", ["banana", "0", "-2", "4,x", "2.5"])
def test_a_bad_omp_num_threads_is_named_at_setup(value):
    # Issue 30 case 11(e): OMP_NUM_THREADS=banana was replaced without a word.
    from corecpu.cpu.threads import configure_threads

    env = {"OMP_NUM_THREADS": value}
    with pytest.raises(CoreCPUError, match=r"OMP_NUM_THREADS='.*' is not a number of threads; export OMP_NUM_THREADS=4"):
        configure_threads(LaunchInfo("single", 0, 1, 0, 1), 1, frozenset(os.sched_getaffinity(0)), env=env)
    assert env == {"OMP_NUM_THREADS": value}  # refused before anything was decided or written


@pytest.mark.parametrize("value", ["", "4", "4,1", " 2 "])
def test_what_openmp_accepts_passes(value):
    from corecpu.cpu.threads import check_omp_num_threads

    check_omp_num_threads({"OMP_NUM_THREADS": value})
    check_omp_num_threads({})


def test_bind_process_moves_the_threads_already_running():
    # A Ray Train worker has some thirty threads of Ray's before setup(); binding only the caller left them (and
    # the record, the union over threads) on every CPU.
    import threading

    from corecpu.cpu.threads import bind_process

    before = frozenset(os.sched_getaffinity(0))
    one = frozenset({min(before)})
    started, stop = threading.Event(), threading.Event()
    ids: list[int] = []
    other = threading.Thread(target=lambda: (ids.append(threading.get_native_id()), started.set(), stop.wait()))
    other.start()
    started.wait()
    try:
        bind_process(one)
        assert os.sched_getaffinity(ids[0]) == one and os.sched_getaffinity(0) == one
    finally:
        stop.set()
        other.join()
        bind_process(before)
