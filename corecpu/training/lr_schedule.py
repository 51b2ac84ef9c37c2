"""The learning-rate schedule train.py uses: linear warm-up to the peak, then linear decay to zero.

The same multipliers as transformers' `get_linear_schedule_with_warmup` (tests/unit/training/test_lr_schedule.py
compares them step by step), and the same torch `LambdaLR`, so checkpoints of either resume with the other.
Not imported from transformers because `transformers.optimization` imports `transformers.trainer_utils`, which
imports peft when it is installed: 1.7 s of every rank's start-up here, for five lines of arithmetic.
"""

from __future__ import annotations

from functools import partial

import torch
from torch.optim.lr_scheduler import LambdaLR


def linear_multiplier(step: int, *, warmup_steps: int, total_steps: int) -> float:
    """Pure: the peak learning rate's multiplier at optimizer step `step`."""
    if step < warmup_steps:
        return float(step) / float(max(1, warmup_steps))
    return max(0.0, float(total_steps - step) / float(max(1, total_steps - warmup_steps)))


def linear_warmup_decay(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int) -> LambdaLR:
    """A scheduler stepping `optimizer`'s learning rates up over `warmup_steps` and down to 0 at `total_steps`."""
    return LambdaLR(optimizer, partial(linear_multiplier, warmup_steps=warmup_steps, total_steps=total_steps))
