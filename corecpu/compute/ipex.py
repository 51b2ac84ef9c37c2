"""Intel Extension for PyTorch, where a user's environment has it (IPEX 2.8 with torch 2.8).

IPEX is archived; corecpu runs without it and applies `ipex.optimize` only when it
imports and matches torch. Everything IPEX needs to round-trip checkpoints and
`final/` unchanged lives here, so train.py keeps one line for it.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch

from corecpu.cpu.hardware import Extension, ipex_status
from corecpu.compute.precision import PrecisionChoice


def wanted(mode: str) -> Extension | None:
    """IPEX's status if `--ipex auto`; None for `off`. Probing imports IPEX, which re-registers
    ATen kernels for the whole process, so `off` must not probe at all."""
    return ipex_status() if mode == "auto" else None


def optimize(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
             precision: PrecisionChoice) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """`ipex.optimize` for training, before DDP wrapping.

    It returns copies: in bf16 a model that computes in bf16 but whose state_dict()
    gives the fp32 master weights, and an optimizer with IPEX's step() whose
    state_dict() keeps torch's layout, so checkpoints load back before optimize()
    on resume. The scheduler must then drive the new optimizer.
    """
    import intel_extension_for_pytorch as ipex_mod

    dtype = precision.autocast_dtype or torch.float32
    model.train()  # optimize() picks inference from model.training, and from_pretrained() returns eval mode
    model, optimizer = ipex_mod.optimize(model, optimizer=optimizer, dtype=dtype)
    scheduler.optimizer = optimizer
    # Expected, not bugs: torch notices IPEX replaced step() after the scheduler wrapped it, and
    # IPEX's layer_norm kernel has no autograd key (its gradients equal torch's; checked bit for bit).
    warnings.filterwarnings("ignore", message=r"Seems like `optimizer\.step\(\)` has been overridden")
    warnings.filterwarnings("ignore", message=r"aten::layer_norm: an autograd kernel was not registered")
    if dtype == torch.bfloat16:
        _save_as_fp32(model)
    return model, optimizer


def _save_as_fp32(model: torch.nn.Module) -> None:
    # save_pretrained writes the fp32 master weights but labels them with the working copy's
    # dtype ("bfloat16" in config.json), and transformers would then load final/ in bf16.
    save_pretrained = model.save_pretrained

    def save_fp32(directory: str | Path, **kwargs: Any) -> None:
        save_pretrained(directory, **kwargs)
        path = Path(directory) / "config.json"
        config = json.loads(path.read_text())
        config.update({k: "float32" for k in ("dtype", "torch_dtype") if k in config})
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    model.save_pretrained = save_fp32  # type: ignore[method-assign]
