"""corecpu.distributed.host_copy: one buffer per host, filled by the host's first rank before any rank reads it, mapped
by every rank of that host, nothing left in the directory; no rank shares where any rank cannot."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from corecpu.distributed.host_copy import ROOM, host_copy, leaders
from helpers.thread_ranks import Group, run_ranks


def test_each_rank_is_led_by_the_lowest_rank_of_its_host() -> None:
    assert leaders(["a", "a", "b", "b"]) == [0, 0, 2, 2]
    assert leaders(["a", "b", "a", "b"]) == [0, 1, 0, 1]  # round-robin placement works too
    assert leaders(["x"]) == [0]


def _ranks(hosts: list[str], body: Callable[[int, Callable[[Any], list[Any]], Callable[[], None]], Any]) -> list[Any]:
    """Threads as ranks: body(rank, gather, barrier) on each, their results in rank order."""
    group, slots = Group(len(hosts)), [None] * len(hosts)

    def gather(rank: int) -> Callable[[Any], list[Any]]:
        def run(obj: Any) -> list[Any]:
            slots[rank] = obj
            group.barrier()
            seen = list(slots)
            group.barrier()
            return seen
        return run

    return run_ranks(len(hosts), group, lambda rank: body(rank, gather(rank), group.barrier))


def _copy(tmp_path: Path, hosts: list[str], *, ok: Callable[[int], bool] = lambda r: True,
          free: int = 1 << 30) -> tuple[list[torch.Tensor | None], list[int]]:
    filled: list[int] = []

    def fill_for(rank: int) -> Callable[[torch.Tensor], None]:
        def fill(buffer: torch.Tensor) -> None:
            assert buffer.dtype == torch.bfloat16 and buffer.shape == (1000,)
            filled.append(rank)
            buffer.copy_(torch.arange(1000) + 1000 * rank)  # which rank filled it shows in the values
        return fill

    def body(rank: int, gather: Callable[[Any], list[Any]], barrier: Callable[[], None]) -> torch.Tensor | None:
        return host_copy(1000, torch.bfloat16, fill_for(rank), ok(rank), rank=rank, gather=gather, barrier=barrier,
                         shm_dir=tmp_path, free=lambda _: free, hostname=lambda: hosts[rank])

    return _ranks(hosts, body), filled


def test_the_first_rank_of_each_host_fills_and_its_ranks_map_that_copy(tmp_path: Path) -> None:
    buffers, filled = _copy(tmp_path, ["a", "b", "a", "b"])
    assert sorted(filled) == [0, 1]
    for rank, buffer in enumerate(buffers):
        assert buffer is not None and torch.equal(buffer, (torch.arange(1000) + 1000 * (rank % 2)).bfloat16())
    buffers[0][0] = 7  # one mapping: a store by one rank is what the other rank of its host reads
    assert buffers[2][0] == 7 and buffers[1][0] != 7
    assert list(tmp_path.iterdir()) == []  # the names are gone; the mappings stay


@pytest.mark.parametrize("case", ["a rank not ok", "too little room", "one rank a host"])
def test_no_rank_shares_where_any_rank_cannot(tmp_path: Path, case: str) -> None:
    hosts = ["a", "b"] if case == "one rank a host" else ["a", "a"]
    ok = (lambda r: r != 1) if case == "a rank not ok" else (lambda r: True)
    free = int(ROOM * 2000) - 1 if case == "too little room" else 1 << 30  # 1,000 bf16 elements need 2,000 bytes
    buffers, filled = _copy(tmp_path, hosts, ok=ok, free=free)
    assert buffers == [None, None] and filled == [] and list(tmp_path.iterdir()) == []


def test_exactly_enough_room_shares(tmp_path: Path) -> None:
    buffers, _ = _copy(tmp_path, ["a", "a"], free=int(ROOM * 2000))
    assert all(b is not None for b in buffers)


def test_room_is_what_this_process_may_write(tmp_path: Path) -> None:
    from corecpu.distributed.host_copy import shm_free
    assert shm_free(tmp_path) > 0 and shm_free(tmp_path / "missing") == 0
    if os.geteuid() != 0:  # root writes anywhere
        tmp_path.chmod(0o500)
        assert shm_free(tmp_path) == 0
