"""One process's word embedding stepped by rows (corecpu.distributed.row_step.OneProcessRowStep): the same weights
and moments as torch's fused step of the whole table, bit for bit, with weight decay, a clip scale, a resume, and
the steps it leaves to torch."""

from __future__ import annotations

import copy

import pytest
import torch

from corecpu.compute.embedding_grad import install as recycle
from corecpu.distributed import row_step

VOCAB, WIDTH, STEPS = 64, 16, 6  # 16 floats a row: every span is whole vectors, as MiniLM's 384 are


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.head = torch.nn.Linear(WIDTH, 2)

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.embed

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids).mean(1)).pow(2).mean()


def batches() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randint(0, VOCAB // 4, (STEPS, 3, 4))  # a quarter of the rows written, in 1-2 of 4 blocks


def train(by_rows: bool, decay: float, scale: float | None, state: dict | None = None, steps: range = range(STEPS),
          accumulate_at: int = -1):
    model = Model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=decay, fused=True)
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    _, source = recycle(model, compile=False, use_ipex=False)
    stepper = row_step.OneProcessRowStep(optimizer, source) if by_rows else None
    xs = batches()
    for step in steps:
        for _ in range(2 if step == accumulate_at else 1):
            model(xs[step]).backward()
        if scale is not None:
            optimizer.grad_scale = torch.tensor(scale)  # as corecpu's clipper folds its scale into the step
        optimizer.step()
        if hasattr(optimizer, "grad_scale"):
            del optimizer.grad_scale
        optimizer.zero_grad(set_to_none=True)
    saved = {"model": copy.deepcopy(model.state_dict()), "optimizer": copy.deepcopy(optimizer.state_dict())}
    return [p.detach().clone() for p in model.parameters()], optimizer, stepper, saved


def moments(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [s[k] for s in optimizer.state.values() for k in ("exp_avg", "exp_avg_sq", "step")]


@pytest.mark.parametrize("decay", [0.1, 0.0])
@pytest.mark.parametrize("scale", [None, 2.5])
def test_rows_stepped_alone_give_torchs_whole_step_bit_for_bit(decay, scale):
    assert row_step.decay_split_is_exact()  # the premise this machine's kernel must meet
    want, torch_opt, _, _ = train(False, decay, scale)
    got, ours, stepper, _ = train(True, decay, scale)
    assert stepper.steps_by_rows == STEPS  # every step went by rows
    assert int(stepper.touched.sum()) == int(torch.unique(batches()).numel()) < VOCAB
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    for a, b in zip(moments(ours), moments(torch_opt)):
        assert torch.equal(a, b)


def test_a_resumed_run_takes_its_written_rows_from_the_moments_and_steps_alike():
    _, _, _, saved = train(True, 0.1, None, steps=range(3))
    want, torch_opt, _, _ = train(False, 0.1, None, state=copy.deepcopy(saved), steps=range(3, STEPS))
    got, ours, stepper, _ = train(True, 0.1, None, state=copy.deepcopy(saved), steps=range(3, STEPS))
    assert stepper.steps_by_rows == STEPS - 3
    for a, b in zip(got + moments(ours), want + moments(torch_opt)):
        assert torch.equal(a, b)


def test_a_step_whose_rows_are_unknown_is_torchs_and_so_are_the_next():
    # Two backward passes before a step: the kept gradient cannot name its rows any more (autograd added into it).
    want, torch_opt, _, _ = train(False, 0.1, None, accumulate_at=2)
    got, ours, stepper, _ = train(True, 0.1, None, accumulate_at=2)
    assert stepper.steps_by_rows == 2 and bool(stepper.touched.all())
    for a, b in zip(got + moments(ours), want + moments(torch_opt)):
        assert torch.equal(a, b)


def test_steppable_only_for_torchs_fused_adam_without_extras():
    p = [torch.nn.Parameter(torch.zeros(2, 2))]
    assert row_step.steppable(torch.optim.AdamW(p, fused=True))
    assert not row_step.steppable(torch.optim.AdamW(p))  # foreach, not fused
    assert not row_step.steppable(torch.optim.AdamW(p, fused=True, amsgrad=True))
    assert not row_step.steppable(torch.optim.SGD(p, lr=0.1))
