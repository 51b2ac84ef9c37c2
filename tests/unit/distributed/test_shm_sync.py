"""The shared-memory barrier and sums of the shared optimizer step: ranks as threads over one set of
buffers (as /dev/shm gives processes), and a rank that ended or never comes named in one line."""

from __future__ import annotations

import os
import time

import pytest
import torch

from corecpu.distributed.shm_sync import SUM_SLOTS, ShmSync, usable
from corecpu.errors import CoreCPUError
from helpers.thread_ranks import Group, run_ranks

pytestmark = pytest.mark.skipif(not usable(), reason="stores seen in program order (x86-64) only")


def buffers(world: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.zeros(world, dtype=torch.int64), torch.zeros(world, dtype=torch.float64), torch.zeros(world, dtype=torch.int64)


def read_late(sync: ShmSync) -> None:
    """This rank reads its slots 5 ms after leaving each barrier, while the others may write the next call's."""
    barrier = sync.barrier

    def late() -> None:
        barrier()
        time.sleep(0.005)

    sync.barrier = late  # type: ignore[method-assign]


def test_no_rank_passes_a_barrier_before_every_rank_reached_it_and_sums_agree():
    world, rounds = 3, 200
    counters, values, pids = buffers(world)
    arrived = [0] * world
    seen: list[list[float]] = [[] for _ in range(world)]

    def rank(r: int) -> None:
        sync = ShmSync(counters, values, pids, rank=r, timeout_s=30)
        for k in range(rounds):
            arrived[r] = k + 1
            sync.barrier()
            assert min(arrived) >= k + 1  # every rank reached round k before anyone left it
            seen[r].append(sync.sum(float(r + 1) * (k + 1)))

    run_ranks(world, Group(world), rank)
    assert seen[0] == seen[1] == seen[2] == [6.0 * (k + 1) for k in range(rounds)]


def test_a_rank_that_ended_is_named():
    counters, values, pids = buffers(2)
    pids[1] = 999_999_999  # the other rank's process, gone
    sync = ShmSync(counters, values, pids, rank=0, timeout_s=60, alive=lambda pid: pid == os.getpid())
    with pytest.raises(CoreCPUError, match=r"rank 1 \(pid 999999999\) ended while the other ranks waited for it"):
        sync.barrier()


def test_a_rank_that_never_comes_times_out_in_one_line():
    counters, values, pids = buffers(2)
    sync = ShmSync(counters, values, pids, rank=0, timeout_s=0.5, alive=lambda pid: True)
    started = time.monotonic()
    with pytest.raises(CoreCPUError, match=r"ranks \[1\] did not reach the ranks' shared-memory sync within 0.5 s"):
        sync.barrier()
    assert time.monotonic() - started < 5


def test_each_rank_counts_the_time_it_stood_waiting_for_the_others():
    counters, values, pids = buffers(2)
    syncs: dict[int, ShmSync] = {}

    def rank(r: int) -> None:
        sync = syncs[r] = ShmSync(counters, values, pids, rank=r, timeout_s=30)
        for _ in range(3):
            if r == 1:
                time.sleep(0.1)  # rank 1 computes longer: rank 0 waits for it at every barrier
            sync.barrier()

    run_ranks(2, Group(2), rank)
    assert 0.25 <= syncs[0].waited_s < 1.0
    assert syncs[1].waited_s < 0.05


def test_every_rank_agrees_on_the_largest_flag_even_when_one_reads_late():
    # Rank 1 reads each agreement's slots 5 ms after leaving its barrier, while rank 0 has gone on to write the next
    # one's: with one set of slots rank 1 would read rank 0's next value (a stop seen a step early on one rank).
    world, rounds = 2, 20
    counters, values, pids = buffers(world)
    flags = torch.zeros(2 * world, dtype=torch.int64)
    seen: list[list[int]] = [[] for _ in range(world)]

    def rank(r: int) -> None:
        sync = ShmSync(counters, values, pids, rank=r, timeout_s=30, flags=flags)
        if r == 1:
            read_late(sync)
        for k in range(rounds):
            seen[r].append(sync.agree_max(k + 1 if r == 0 else 0))

    run_ranks(world, Group(world), rank)
    assert seen[0] == seen[1] == list(range(1, rounds + 1))


def test_agreeing_without_the_flags_buffer_is_an_error():
    counters, values, pids = buffers(1)
    with pytest.raises(CoreCPUError, match="needs the flags buffer"):
        ShmSync(counters, values, pids, rank=0, timeout_s=1).agree_max(0)


def test_sums_of_several_numbers_agree_on_every_rank_even_when_one_reads_late():
    # As agree_max: rank 1 reads each sum 5 ms after leaving its barrier while rank 0 writes the next call's values.
    world, rounds = 2, 20
    counters, values, pids = buffers(world)
    sums = torch.zeros(2 * world * SUM_SLOTS, dtype=torch.float64)
    seen: list[list[list[float]]] = [[] for _ in range(world)]

    def rank(r: int) -> None:
        sync = ShmSync(counters, values, pids, rank=r, timeout_s=30, sums=sums)
        if r == 1:
            read_late(sync)
        for k in range(rounds):
            seen[r].append(sync.sum_all([0.1 * (r + 1), float(k), float(r * k)] if k % 2 else [float(k + r)]))

    run_ranks(world, Group(world), rank)
    want = [[0.1 + 0.2, 2.0 * k, float(k)] if k % 2 else [2.0 * k + 1] for k in range(rounds)]
    assert seen[0] == seen[1] == want


def test_a_sum_too_long_for_the_slots_or_without_them_is_an_error():
    counters, values, pids = buffers(1)
    with pytest.raises(CoreCPUError, match="needs the sums buffer"):
        ShmSync(counters, values, pids, rank=0, timeout_s=1).sum_all([1.0])
    sums = torch.zeros(2 * SUM_SLOTS, dtype=torch.float64)
    sync = ShmSync(counters, values, pids, rank=0, timeout_s=1, sums=sums)
    assert sync.sum_all([1.0] * SUM_SLOTS) == [1.0] * SUM_SLOTS
    with pytest.raises(CoreCPUError, match=f"at most {SUM_SLOTS} numbers"):
        sync.sum_all([1.0] * (SUM_SLOTS + 1))
