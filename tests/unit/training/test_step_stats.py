"""A log record's sums over the ranks: the loss weighted by what each rank's is a mean over, and per-rank values
(peak RSS, seconds waited) gathered in the same all-reduce."""

from __future__ import annotations

import pytest
import torch

from corecpu.training.schedule import StepStats


def test_ranks_values_come_back_per_value_for_every_rank_in_one_all_reduce() -> None:
    world = 3
    sent: list[list[float]] = []
    stats = []
    for rank in range(world):
        s = StepStats()
        s.add(torch.tensor(1.0 + rank), samples=4, tokens=40 + rank, padded=2)
        stats.append(s)
    # Every rank's contribution first, then the sum each rank would get back.
    for rank, s in enumerate(stats):
        s.reduce(lambda xs: (sent.append(list(xs)), list(xs))[1], rank=rank, world_size=world,
                 rank_values=[100.0 + rank, 0.5 * rank])
    total = [sum(col) for col in zip(*sent)]
    out = StepStats()
    out.add(torch.tensor(0.0), samples=0, tokens=0)
    reduced = out.reduce(lambda xs: total, rank=0, world_size=world, rank_values=[0.0, 0.0])
    assert len(sent) == world and all(len(v) == 6 + 2 * world for v in sent)
    assert reduced["per_rank"] == [[100.0, 101.0, 102.0], [0.0, 0.5, 1.0]]
    assert reduced["loss"] == pytest.approx(2.0) and reduced["samples"] == 12 and reduced["tokens"] == 123


def test_without_rank_values_nothing_per_rank_is_sent() -> None:
    s = StepStats()
    s.add(torch.tensor(0.5), samples=2, tokens=10)
    sent: list[list[float]] = []
    reduced = s.reduce(lambda xs: (sent.append(list(xs)), list(xs))[1], rank=1, world_size=2)
    assert len(sent[0]) == 6 and reduced["per_rank"] == []
