"""The shared optimizer step with a gradient summed by rows (the word embedding's, most rows of which are zero in a
step): the same steps as DDP's dense mean gradient, for 2 and 3 ranks, when a rank cannot say its rows, and with the
slices balanced by work."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from corecpu.distributed.shared_adamw import SharedAdamW, balanced_bounds
from corecpu.training.clipping import GradientClipper
from helpers.thread_ranks import Group, run_ranks

STEPS = 5
VOCAB, WIDTH = 40, 4


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.head = torch.nn.Linear(WIDTH, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens).mean(1)).pow(2).mean()


class Rows:
    """The rows a step's lookups wrote, as the kept embedding gradient tells them (None: it cannot say)."""

    def __init__(self, weight: torch.nn.Parameter) -> None:
        self.weight, self.rows = weight, None

    def reduced_rows(self, grad: torch.Tensor) -> torch.Tensor | None:
        return self.rows


def tokens(world: int) -> torch.Tensor:
    torch.manual_seed(1)
    out = torch.randint(0, VOCAB // 2, (world, STEPS, 3, 5))
    out[0, 2] += VOCAB // 2  # one rank's rows in the other half: rows of one rank only, in another rank's slice
    return out


def optimizer_for(model: torch.nn.Module) -> torch.optim.AdamW:
    return torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1, fused=True)


def reference(world: int, xs: torch.Tensor, max_norm: float | None) -> list[torch.Tensor]:
    model = Model()
    optimizer = optimizer_for(model)
    for step in range(STEPS):
        grads = []
        for rank in range(world):
            model.zero_grad(set_to_none=True)
            model(xs[rank, step]).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for p, *gs in zip(model.parameters(), *grads):
            p.grad = sum(gs) / world
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def run(world: int, xs: torch.Tensor, max_norm: float | None, shm_dir: Path, unsaid: tuple[int, int] = (-1, -1)):
    group = Group(world)
    models = [Model() for _ in range(world)]

    def body(rank: int):
        model = models[rank]
        optimizer = optimizer_for(model)
        rows = Rows(model.embed.weight)
        shared = SharedAdamW(optimizer, rank=rank, world=world, barrier=group.barrier,
                             sum_scalar=lambda x: group.sum_scalar(rank, x), share_tag=lambda tag: "rows",
                             rows=[rows], shm_dir=shm_dir)
        model.register_forward_pre_hook(shared.attach_grads)
        clip = GradientClipper(model.parameters(), optimizer, shared=shared)
        for step in range(STEPS):
            model(xs[rank, step]).backward()
            rows.rows = None if (rank, step) == unsaid else torch.unique(xs[rank, step])
            if max_norm is not None:  # else no all-reduce between the summing and the stepping
                clip(max_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return [p.detach().clone() for p in model.parameters()], (shared.lo, shared.hi)

    return run_ranks(world, group, body)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("max_norm", [0.01, 1e9, None], ids=["clipped", "unclipped", "no-clip"])
def test_rows_summed_alone_give_ddp_dense_steps(tmp_path, world, max_norm):
    xs = tokens(world)
    want = reference(world, xs, max_norm)
    results = run(world, xs, max_norm, tmp_path)
    for weights, _ in results:
        for got, expected in zip(weights, want):
            torch.testing.assert_close(got, expected, rtol=2e-6, atol=2e-7)
    slices = [s for _, s in results]
    assert slices[0][0] == 0 and slices[-1][1] == sum(p.numel() for p in Model().parameters())
    assert all(a[1] == b[0] for a, b in zip(slices, slices[1:]))  # the slices tile the parameters
    assert list(tmp_path.iterdir()) == []


def test_a_rank_that_cannot_say_its_rows_has_the_part_summed_whole(tmp_path):
    xs = tokens(2)
    want = reference(2, xs, 1e9)
    for weights, _ in run(2, xs, 1e9, tmp_path, unsaid=(1, 3)):
        for got, expected in zip(weights, want):
            torch.testing.assert_close(got, expected, rtol=2e-6, atol=2e-7)


def test_balanced_bounds():
    # Equal costs: equal parts.
    assert balanced_bounds([10, 10], [1.0, 1.0], [0, 0], 2) == [0, 10, 20]
    # Parameter 1's elements cost twice parameter 0's: 100 + 50 x 2 = 200, half at 100.
    assert balanced_bounds([100, 50], [1.0, 2.0], [10, 0], 2) == [0, 100, 150]
    # A boundary inside a parameter with rows falls between rows: half of 100 + 24 x 2 is 74 elements in, so row 7.
    assert balanced_bounds([100, 24], [1.0, 2.0], [10, 0], 2) == [0, 70, 124]
    # The summing pass's partition, 3 ranks: 1000 row-summed elements cost 100, the 300 dense ones 300; a third of
    # 400 each: rank 0 the rows and 33 dense elements, the others 133 or 134.
    assert balanced_bounds([1000, 300], [0.1, 1.0], [10, 0], 3) == [0, 1033, 1167, 1300]
    # More ranks than there is work for: the bounds never go back; the last rank may get nothing.
    b = balanced_bounds([1], [1.0], [0], 4)
    assert b[0] == 0 and b[-1] == 1 and b == sorted(b)
    assert balanced_bounds([0, 0], [1.0, 1.0], [0, 0], 2) == [0, 0, 0]
