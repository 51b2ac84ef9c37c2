"""The user's module inside the wrappers corecpu applies: DDP and torch.compile."""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module checkpoints and save_pretrained want. Only DDP's `.module` and torch.compile's
    `._orig_mod` are followed: a model's own child named `module` is part of the model."""
    while True:
        if isinstance(model, DistributedDataParallel):
            model = model.module
        elif isinstance(model, torch.nn.Module) and isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        else:
            return model
