"""The shared optimizer step with a gradient summed by rows (the word embedding's, most rows of which are zero in a
step): the same steps as DDP's dense mean gradient, for 2 and 3 ranks, when a rank cannot say its rows, and with the
slices balanced by work; rows no step wrote left to the decay, bit for bit what the kernel gives them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from corecpu.distributed import row_step
from corecpu.distributed.row_step import step_bounds
from corecpu.distributed.shared_adamw import SharedAdamW
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


def optimizer_for(model: torch.nn.Module, weight_decay: float = 0.1) -> torch.optim.AdamW:
    return torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=weight_decay, fused=True)


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


def run(world: int, xs: torch.Tensor, max_norm: float | None, shm_dir: Path, unsaid: tuple[int, int] = (-1, -1),
        weight_decay: float = 0.1, resume_at: int = -1):
    """Each rank's weights and its (static) slice; with `resume_at`, the run restarts at that step from its state
    dict, as a resume does."""
    group = Group(world)
    models = [Model() for _ in range(world)]
    shm_dir.mkdir(exist_ok=True)

    def make(rank: int, model: torch.nn.Module, saved: tuple | None = None):
        optimizer = optimizer_for(model, weight_decay)
        if saved is not None:
            model.load_state_dict(saved[0])
            optimizer.load_state_dict(saved[1])
        rows = Rows(model.embed.weight)
        shared = SharedAdamW(optimizer, rank=rank, world=world, barrier=group.barrier,
                             sum_scalar=lambda x: group.sum_scalar(rank, x), share_tag=lambda tag: "rows",
                             rows=[rows], shm_dir=shm_dir)
        model.register_forward_pre_hook(shared.attach_grads)
        return optimizer, rows, shared, GradientClipper(model.parameters(), optimizer, shared=shared)

    def body(rank: int):
        model = models[rank]
        optimizer, rows, shared, clip = make(rank, model)
        for step in range(STEPS):
            if step == resume_at:
                saved = ({k: v.clone() for k, v in model.state_dict().items()}, optimizer.state_dict())
                group.barrier()
                model = Model()
                optimizer, rows, shared, clip = make(rank, model, saved)
            model(xs[rank, step]).backward()
            rows.rows = None if (rank, step) == unsaid else torch.unique(xs[rank, step])
            if max_norm is not None:  # else no all-reduce between the summing and the stepping
                clip(max_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        moments = [optimizer.state[p][k].clone() for p in model.parameters() for k in ("exp_avg", "exp_avg_sq")]
        touched = {i: int(t.sum()) for i, t in shared._touched.items()}
        return [p.detach().clone() for p in model.parameters()] + moments, (shared.lo, shared.hi), touched

    return run_ranks(world, group, body)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("max_norm", [0.01, 1e9, None], ids=["clipped", "unclipped", "no-clip"])
def test_rows_summed_alone_give_ddp_dense_steps(tmp_path, world, max_norm):
    xs = tokens(world)
    want = reference(world, xs, max_norm)
    results = run(world, xs, max_norm, tmp_path)
    for weights, _, _ in results:
        for got, expected in zip(weights, want):
            torch.testing.assert_close(got, expected, rtol=2e-6, atol=2e-7)
    slices = [s for _, s, _ in results]
    assert slices[0][0] == 0 and slices[-1][1] == sum(p.numel() for p in Model().parameters())
    assert all(a[1] == b[0] for a, b in zip(slices, slices[1:]))  # the slices tile the parameters
    assert list(tmp_path.iterdir()) == []


def test_a_rank_that_cannot_say_its_rows_has_the_part_summed_whole(tmp_path):
    xs = tokens(2)
    want = reference(2, xs, 1e9)
    for weights, _, _ in run(2, xs, 1e9, tmp_path, unsaid=(1, 3)):
        for got, expected in zip(weights, want):
            torch.testing.assert_close(got, expected, rtol=2e-6, atol=2e-7)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("weight_decay", [0.1, 0.0])
@pytest.mark.parametrize("max_norm", [0.01, None], ids=["clipped", "no-clip"])
@pytest.mark.parametrize("resume_at", [-1, 3], ids=["straight", "resumed"])
def test_rows_no_step_wrote_are_left_to_the_decay(tmp_path, monkeypatch, world, weight_decay, max_norm,
                                                  resume_at):
    monkeypatch.setattr(row_step, "BLOCK_ROWS", 2)  # blocks small enough that some are never written here
    xs = tokens(world)
    by_rows = run(world, xs, max_norm, tmp_path / "rows", weight_decay=weight_decay, resume_at=resume_at)
    monkeypatch.setattr(row_step, "decay_split_is_exact", lambda: False)  # every row stepped, as before
    whole = run(world, xs, max_norm, tmp_path / "whole", weight_decay=weight_decay, resume_at=resume_at)
    written = torch.unique(xs)
    unwritten = torch.ones(VOCAB, dtype=torch.bool)
    unwritten[written] = False
    assert 0 < int(unwritten.sum()) < VOCAB
    for (got, _, touched), (want, _, none) in zip(by_rows, whole):
        assert touched == {0: written.numel()} and none == {}  # the rows were tracked
        # got/want: the 3 weights, then each parameter's two moments (the embedding's first). Rows no step wrote:
        # the decay alone, bit for bit, and no moments.
        assert torch.equal(got[0][unwritten], want[0][unwritten])
        assert not got[3][unwritten].any() and not got[4][unwritten].any()
        if weight_decay:
            assert not torch.equal(got[0][unwritten], Model().embed.weight.detach()[unwritten])
        # Elsewhere the kernel's own rounding: its vector and scalar paths round exp_avg_sq apart, so moving a
        # run's boundary moves last bits (as the slices between ranks do already).
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-7)


def test_a_kernel_whose_decay_is_not_a_multiply_is_not_split(monkeypatch):
    row_step.decay_split_is_exact.cache_clear()
    assert row_step.decay_split_is_exact() in (True, False)
    monkeypatch.setattr(torch, "_fused_adamw_", _decay_by_subtraction(torch._fused_adamw_))
    row_step.decay_split_is_exact.cache_clear()
    try:
        assert row_step.decay_split_is_exact() is False
    finally:
        monkeypatch.undo()
        row_step.decay_split_is_exact.cache_clear()


def _decay_by_subtraction(kernel):
    """The fused kernel, but decaying as `w - lr * wd * w` (rounds differently from the multiply)."""
    def fused(params, grads, exp_avgs, exp_avg_sqs, maxes, steps, *, lr, weight_decay, **kw):
        for w in params:
            w.sub_(w * (lr * weight_decay))
        kernel(params, grads, exp_avgs, exp_avg_sqs, maxes, steps, lr=lr, weight_decay=0.0, **kw)
    return fused


def test_spans_and_costs_follow_the_written_blocks(monkeypatch):
    monkeypatch.setattr(row_step, "BLOCK_ROWS", 4)
    touched = torch.zeros(18, dtype=torch.bool)
    touched[[1, 2, 9, 16]] = True
    active = row_step.active_blocks(touched)
    assert active.tolist() == [True, False, True, False, True]
    assert row_step.spans(active, 0, 18) == [(0, 4), (8, 12), (16, 18)]
    assert row_step.spans(active, 2, 10) == [(2, 4), (8, 10)]  # clipped to the range asked for
    assert row_step.spans(active, 4, 8) == [] and row_step.spans(active, 5, 5) == []
    costs = row_step.row_costs(active, 18, 10, decays=True)
    assert costs[0] == pytest.approx(10 * (row_step.KERNEL_COST + row_step.DECAY_COST))
    assert costs[5] == pytest.approx(10 * row_step.DECAY_COST)
    assert row_step.row_costs(active, 18, 10, decays=False)[5] == 0.0
    moments = torch.zeros(3, 2), torch.zeros(3, 2)
    moments[1][2, 1] = 1e-30
    assert row_step.touched_from_moments(*moments).tolist() == [False, False, True]


def test_step_bounds():
    rows = lambda n, cost: torch.full((n,), float(cost))  # noqa: E731 (a row's total cost)
    # Equal costs: equal parts.
    assert step_bounds([10, 10], [1.0, 1.0], 2) == [0, 10, 20]
    # Parameter 1's elements cost twice parameter 0's: 100 + 50 x 2 = 200, half at 100.
    assert step_bounds([100, 50], [rows(10, 10), 2.0], 2) == [0, 100, 150]
    # A boundary inside a parameter with rows falls between rows: half of 100 + 24 x 2 is 74 elements in, so row 7.
    assert step_bounds([100, 24], [rows(10, 10), 2.0], 2) == [0, 70, 124]
    # The summing pass's partition, 3 ranks: 1000 row-summed elements cost 100, the 300 dense ones 300; a third of
    # 400 each: rank 0 the rows and 33 dense elements, the others 133 or 134.
    assert step_bounds([1000, 300], [rows(100, 1), 1.0], 3) == [0, 1033, 1167, 1300]
    # Rows of unequal cost (the written ones cost the kernel): the boundary follows the work, not the elements
    # (which would put it at 30).
    assert step_bounds([40, 20], [torch.tensor([20.0, 0.0, 0.0, 0.0]), 1.0], 2) == [0, 40, 60]
    assert step_bounds([40, 20], [torch.tensor([0.0, 0.0, 30.0, 30.0]), 1.0], 2) == [0, 30, 60]
    # More ranks than there is work for: the bounds never go back; the last rank may get nothing.
    b = step_bounds([1], [1.0], 4)
    assert b[0] == 0 and b[-1] == 1 and b == sorted(b)
    assert step_bounds([0, 0], [1.0, 1.0], 2) == [0, 0, 0]
