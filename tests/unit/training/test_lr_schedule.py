"""train.py's schedule: transformers' linear warm-up and decay, step for step, and resumable across the two."""

import pytest
import torch
from transformers import get_linear_schedule_with_warmup

from corecpu.training.lr_schedule import linear_warmup_decay


def _lrs(scheduler, optimizer, steps):
    out = []
    for _ in range(steps):
        out.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    return out


def _optimizer():
    p, q = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))
    return torch.optim.AdamW([{"params": [p]}, {"params": [q], "lr": 1e-3}], lr=5e-5)


@pytest.mark.parametrize("warmup, total", [(0, 10), (3, 10), (10, 10), (1, 1), (0, 0), (4, 250)])
def test_the_same_rates_as_transformers(warmup, total):
    ours, theirs = _optimizer(), _optimizer()
    got = _lrs(linear_warmup_decay(ours, warmup, total), ours, total + 3)
    want = _lrs(get_linear_schedule_with_warmup(theirs, warmup, total), theirs, total + 3)
    assert got == want  # exact: the same arithmetic
    assert got[-1] == [0.0, 0.0]


def test_a_state_saved_by_either_resumes_the_other():
    a = _optimizer()
    theirs = get_linear_schedule_with_warmup(a, 3, 20)
    _lrs(theirs, a, 7)
    b = _optimizer()
    ours = linear_warmup_decay(b, 3, 20)
    ours.load_state_dict(theirs.state_dict())
    b.load_state_dict(a.state_dict())
    assert _lrs(ours, b, 5) == _lrs(theirs, a, 5)
