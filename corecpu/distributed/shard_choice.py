"""Whether a run sums its gradients and steps AdamW through shared memory (`--shard-optimizer auto|shm|off`), and
why not: `unsupported()`'s one line. The step itself is corecpu.distributed.shared_adamw."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from corecpu.distributed.row_step import fused_adam_gap
from corecpu.errors import CoreCPUError

SHARD_CHOICES = ("auto", "shm", "off")
SHM_DIR = Path("/dev/shm")


@dataclass(frozen=True)
class ShardChoice:
    name: str  # "shm" or "off"
    reason: str

    def __str__(self) -> str:
        return f"{self.name} ({self.reason})"


def shm_bytes(numel: int, world: int) -> int:
    """/dev/shm this needs: weights, two moments, the mean gradient and a gradient buffer per rank, all fp32, and
    the bf16 copies of the Linear weights (corecpu.distributed.cast_cache; counted as if every weight were one), and
    a few row numbers."""
    return (4 + world) * numel * 4 + numel * 2


def unsupported(optimizer: torch.optim.Optimizer | None, model: torch.nn.Module, *, world: int, local_world: int,
                use_ipex: bool, named: str = "", free_bytes: Callable[[], int] | None = None) -> str:
    """Why this run cannot shard its optimizer through shared memory; "" when it can. `named`: the DDP-side
    choice the user made by name (`--backend ccl`, `--grad-clip torch`), which sharding would ignore."""
    if world < 2:
        return "single process"
    if local_world != world:
        return "ranks on more than one host"
    if named:
        return f"{named} was asked for, which works on DDP's gradients"
    if use_ipex:
        return "IPEX brings its own optimizer step"
    if optimizer is None:
        return "no optimizer passed to wrap()"
    if gap := fused_adam_gap(optimizer):
        return gap
    if any(getattr(m, "track_running_stats", False) for m in model.modules()):
        return "the model has running statistics (batch norm), which DDP keeps in step"
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    if any(p.dtype != torch.float32 or p.is_sparse for p in params):
        return "a trained parameter is not a dense fp32 tensor"
    if len({id(p) for p in params}) != len(params):
        return "a parameter is in the optimizer twice"
    need = shm_bytes(sum(p.numel() for p in params), world)
    free = (free_bytes or _shm_free)()
    if free < need * 1.1:
        return (f"{SHM_DIR} has {free / 2**20:,.0f} MiB free and this needs {need / 2**20:,.0f} MiB "
                "(a container: docker run --shm-size, or a memory-backed emptyDir on /dev/shm)")
    return ""


def decide(requested: str, why_not: str) -> ShardChoice:
    """`requested` auto|shm|off against unsupported()'s line. An explicit shm that cannot run is an error."""
    if requested == "off":
        return ShardChoice("off", "requested")
    if why_not:
        if requested == "shm":
            raise CoreCPUError(f"--shard-optimizer shm cannot run here: {why_not}; use --shard-optimizer off")
        return ShardChoice("off", why_not)
    return ShardChoice("shm", "requested" if requested == "shm" else
                       "every rank on one host: gradients summed and AdamW stepped by slices in shared memory")


def _shm_free() -> int:
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


__all__ = ["SHARD_CHOICES", "SHM_DIR", "ShardChoice", "decide", "shm_bytes", "unsupported"]
