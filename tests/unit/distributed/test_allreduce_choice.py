"""`--allreduce auto` by measurement: the pure pick, the cache, and the collective protocol with fake ranks."""

from __future__ import annotations

import time

import pytest

from corecpu.distributed import allreduce_choice as ac
from corecpu.errors import CoreCPUError


def test_the_path_whose_slowest_rank_is_fastest_wins() -> None:
    # MPI is faster on rank 0 but slow on rank 1: the step waits for rank 1, so gloo's worst case wins.
    timings = [{"gloo": 30.0, "mpi": 10.0}, {"gloo": 31.0, "mpi": 40.0}]
    choice, why = ac.pick(timings, ["gloo", "mpi"])
    assert choice == "gloo" and why == "measured one 25 MB bucket beside compute: gloo 31.0 ms, mpi 40.0 ms"
    assert ac.pick([{"gloo": 5.0, "shm": 5.0}], ["shm", "gloo"])[0] == "shm"  # a tie keeps the given order


def test_pick_refuses_missing_or_no_candidates() -> None:
    with pytest.raises(CoreCPUError, match="no timing for mpi"):
        ac.pick([{"gloo": 1.0}, {"gloo": 1.0, "mpi": 1.0}], ["gloo", "mpi"])
    with pytest.raises(CoreCPUError, match="no gradient all-reduce path"):
        ac.pick([], [])


def test_measure_interleaves_paths_and_skips_the_warm_up() -> None:
    calls: list[str] = []
    barriers = []
    class Done:
        def wait(self) -> None:
            calls.append("wait")

    def start(name: str):
        return lambda t: calls.append(name) or Done()

    timings = ac.measure({"a": start("a"), "b": start("b")}, barrier=lambda: barriers.append(1), numel=4, repeats=2)
    assert calls == ["a", "wait", "b", "wait"] * 3 and len(barriers) == 6 and set(timings) == {"a", "b"}


def test_the_first_run_measures_and_caches_the_next_reads(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CORECPU_CACHE_DIR", str(tmp_path))
    measured: list[int] = []
    monkeypatch.setattr(ac, "measure", lambda paths, barrier, beside: measured.append(1) or {"gloo": 30.0, "mpi": 19.0})
    key = ac.cache_key("Xeon", 2, 2, 1, ["mpi", "gloo"], "2.13.0")
    built: list[int] = []
    one_rank = dict(rank=0, gather=lambda x: [x, x], barrier=lambda: None)
    make = lambda: built.append(1) or {"gloo": None, "mpi": None}  # noqa: E731 - builds the hooks: only to measure
    assert ac.choose_by_measurement(["gloo", "mpi"], make, key, **one_rank) == (
        "mpi", "measured one 25 MB bucket beside compute: mpi 19.0 ms, gloo 30.0 ms")
    choice, why = ac.choose_by_measurement(["gloo", "mpi"], make, key, **one_rank)
    assert (choice, why.endswith("(cached)"), len(measured), len(built)) == ("mpi", True, 1, 1)
    # Another candidate set (shm became available) is another key: measured afresh.
    other = ac.cache_key("Xeon", 2, 2, 1, ["mpi", "gloo", "shm"], "2.13.0")
    assert other != key and ac.cached(other) is None
    # So is a start where launch.sh found CPUs busy: the paths rank differently beside a neighbour.
    assert ac.cache_key("Xeon", 2, 2, 1, ["mpi", "gloo"], "2.13.0", busy=True) not in (key, other)


def test_each_timed_allreduce_runs_beside_compute_and_the_time_covers_both() -> None:
    events: list[str] = []

    class Work:
        def __init__(self, name: str) -> None:
            self.name = name

        def wait(self) -> None:
            events.append(f"wait {self.name}")

    def start(name: str):
        return lambda buf: events.append(f"start {name}") or Work(name)

    def compute() -> None:
        events.append("compute")
        time.sleep(0.02)

    got = ac.measure({"a": start("a")}, barrier=lambda: None, numel=4, repeats=2, beside=compute)
    assert events[:3] == ["start a", "compute", "wait a"] and len(events) == 9  # warm-up + 2 timed rounds
    assert got["a"] >= 20.0  # the compute's 20 ms are in the time


def test_compute_block_takes_about_its_target() -> None:
    # This thread's CPU time, on one thread: a loaded CI machine stretches the wall clock (0.96 s seen), not that.
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        block = ac.compute_block(30.0)
        start = time.thread_time()
        block()
        assert 0.005 < time.thread_time() - start < 0.5  # calibrated on the wall clock, so not exact
    finally:
        torch.set_num_threads(threads)
