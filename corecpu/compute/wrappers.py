"""The user's module inside the wrappers corecpu applies: DDP and torch.compile."""

from __future__ import annotations

import contextlib
from typing import Iterator

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


@contextlib.contextmanager
def saving_unwrapped() -> Iterator[None]:
    """Around save_pretrained of a model unwrap() returned. transformers unwraps it again through accelerate,
    whose check for a DeepSpeedEngine imports deepspeed wherever it is installed (the shm extra installs it), and
    deepspeed imports mlflow where that is: 2.1-2.6 s of every final save on the 2-vCPU EPYC (measured), for a
    model that holds no wrapper. Inside, transformers' unwrap_model is unwrap()."""
    import transformers.modeling_utils as modeling_utils

    original = getattr(modeling_utils, "unwrap_model", None)
    if original is None:  # a transformers without it has nothing to skip
        yield
        return

    def unwrap_model(model: torch.nn.Module, recursive: bool = False) -> torch.nn.Module:
        return original(model, recursive=True) if recursive else unwrap(model)

    modeling_utils.unwrap_model = unwrap_model
    try:
        yield
    finally:
        modeling_utils.unwrap_model = original
