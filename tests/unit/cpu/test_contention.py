"""What else used a rank's CPUs: /proc/stat's counters read for a set of CPUs, the shares other processes and the
hypervisor took between two readings, and which CPUs a rank may watch."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corecpu.cpu.contention import CpuTimes, Taken, parse, sample, taken, watched_cpus

#                   user nice system idle iowait irq softirq steal guest guest_nice
STAT = """cpu  900 90 300 5000 20 10 10 40 0 0
cpu0 400 40 100 3000 10 5 5 10 0 0
cpu1 500 50 200 2000 10 5 5 30 0 0
intr 12345
"""


def test_busy_is_user_system_irq_softirq_and_steal_not_nice_idle_or_iowait() -> None:
    busy, steal, total = parse(STAT, [1], ticks_per_s=100)
    assert busy == pytest.approx((500 + 200 + 5 + 5 + 30) / 100)
    assert steal == pytest.approx(0.30)
    assert total == pytest.approx((500 + 50 + 200 + 2000 + 10 + 5 + 5 + 30) / 100)
    both = parse(STAT, [0, 1], ticks_per_s=100)
    assert both is not None and both[1] == pytest.approx(0.40)
    assert parse(STAT, [2], ticks_per_s=100) is None  # a CPU /proc/stat does not list: nothing to watch
    # A rank started with `nice` has its own time in the nice column: counted, or it would hide a neighbour's.
    niced = parse(STAT, [1], ticks_per_s=100, niced=True)
    assert niced is not None and niced[0] == pytest.approx(busy + 0.50)
    assert parse(STAT, [], ticks_per_s=100) is None


def test_others_is_busy_less_steal_less_this_process_and_clamped() -> None:
    before = CpuTimes(busy=10.0, steal=1.0, total=100.0, own=5.0)
    after = CpuTimes(busy=60.0, steal=6.0, total=200.0, own=25.0)
    t = taken(before, after)
    assert t == Taken(others=pytest.approx(0.25), steal=pytest.approx(0.05))
    # The process clock runs ahead of /proc/stat's ticks on a quiet interval: never below zero.
    assert taken(before, CpuTimes(busy=20.0, steal=1.0, total=120.0, own=15.5)) == Taken(others=0.0, steal=0.0)
    assert taken(before, before) is None


def test_sample_reads_the_file_and_the_process_clock(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(STAT)
    ticks = os.sysconf("SC_CLK_TCK")
    got = sample([0], proc_stat=stat, own=lambda: 7.5)
    assert got == CpuTimes(busy=(400 + 100 + 5 + 5 + 10) / ticks, steal=10 / ticks,
                           total=(400 + 40 + 100 + 3000 + 10 + 5 + 5 + 10) / ticks, own=7.5)
    niced = sample([0], proc_stat=stat, own=lambda: 7.5, niceness=lambda: 10)
    assert niced is not None and niced.busy == pytest.approx((400 + 40 + 100 + 5 + 5 + 10) / ticks)
    assert sample([0], proc_stat=tmp_path / "missing") is None
    assert sample([5], proc_stat=stat) is None


def test_a_rank_watches_its_own_cpus_unless_a_rank_of_its_host_shares_them() -> None:
    ranks = [{"host": "a", "cpus": [0, 1]}, {"host": "a", "cpus": [2, 3]}, {"host": "b", "cpus": [0, 1]}]
    assert watched_cpus(0, ranks) == [0, 1]  # rank 2 has CPUs 0-1 too, on another host
    assert watched_cpus(1, ranks) == [2, 3]
    shared = [{"host": "a", "cpus": [0, 1]}, {"host": "a", "cpus": [1, 2]}]
    assert watched_cpus(0, shared) == [] and watched_cpus(1, shared) == []
    assert watched_cpus(0, [{"host": "a"}]) == []
    assert watched_cpus(3, ranks) == []


@pytest.mark.skipif(not Path("/proc/stat").exists() or not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_a_busy_loop_on_the_watched_cpu_reads_as_others() -> None:
    cpu = max(os.sched_getaffinity(0))
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(loop.pid, {cpu})
        time.sleep(0.3)  # the loop has started
        before = sample([cpu])
        time.sleep(1.0)
        after = sample([cpu])
    finally:
        loop.kill()
        loop.wait()
    assert before is not None and after is not None
    t = taken(before, after)
    assert t is not None and t.others >= 0.5, t  # the loop had that CPU, bar what else the host ran there
