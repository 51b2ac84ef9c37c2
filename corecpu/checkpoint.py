"""Checkpoints: everything needed to continue a run exactly where it stopped.

Layout: OUTPUT_DIR/checkpoints/step-00000120/{state.pt, meta.json}. Rank 0 writes
into a temporary directory and renames it into place, so a directory named
step-* is always complete; meta.json is written last as a second witness.
Every rank's RNG state is gathered and stored, because dropout draws differ
per rank and an exact resume must restore each one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from corecpu.dist import gather_objects
from corecpu.errors import CoreCPUError

PREFIX = "step-"


@dataclass
class LoopState:
    """Where the loop is: optimizer steps taken, and the position in the data."""

    step: int = 0
    epoch: int = 0
    batches_in_epoch: int = 0  # micro-batches of `epoch` already consumed
    extra: dict[str, Any] = field(default_factory=dict)


def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        # weights_only loading refuses numpy arrays; keep the key as a tensor.
        "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_tuples(state["python"]))
    name, key, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, key.numpy().astype(np.uint32), pos, has_gauss, cached))


def _tuples(x: Any) -> Any:
    # random.setstate wants tuples; serialisation may hand back lists.
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first by the time they were saved.

    Not by step: a fresh run into a directory that still holds a longer, older run
    must neither have its new checkpoints pruned nor resume from the stale ones.
    """
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        if not (p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit()):
            continue
        try:
            saved_at = json.loads((p / "meta.json").read_text()).get("saved_at", 0.0)
        except (OSError, ValueError):
            continue  # no readable meta.json: not a complete checkpoint
        found.append((saved_at, int(p.name[len(PREFIX):]), p))
    return [p for _, _, p in sorted(found)]


def save_checkpoint(
    output_dir: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    loop: LoopState,
    config: dict[str, Any],
    keep: int,
) -> Path | None:
    """Collective: every rank calls it; rank 0 writes. Returns the directory on rank 0."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    states = gather_objects(rng_state())
    final = checkpoint_root(output_dir) / f"{PREFIX}{loop.step:08d}"
    if rank == 0:
        tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        torch.save(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "rng": states,
            },
            tmp / "state.pt",
        )
        meta = {"step": loop.step, "epoch": loop.epoch, "batches_in_epoch": loop.batches_in_epoch,
                "world_size": len(states), "saved_at": time.time(), "config": config, **loop.extra}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        if final.exists():  # the same step saved twice (e.g. --save-every hits the last step)
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in list_checkpoints(output_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    if dist.is_initialized():
        dist.barrier()
    return final if rank == 0 else None


def find_resume(output_dir: str | Path, resume: str) -> Path | None:
    """The checkpoint to resume from: None for a fresh start."""
    if not resume:
        return None
    if resume == "auto":
        found = list_checkpoints(output_dir)
        return found[-1] if found else None
    path = Path(resume)
    if not (path / "meta.json").is_file() or not (path / "state.pt").is_file():
        raise CoreCPUError(f"--resume {resume}: not a complete corecpu checkpoint (needs state.pt and meta.json); "
                           "pass --resume auto or a checkpoints/step-* directory")
    return path


# Settings that change the math of the run; anything else (logging, paths) may differ on resume.
RUN_DEFINING = ("model", "data", "eval_data", "batch_size", "grad_accum", "lr", "weight_decay", "warmup_ratio",
                "max_grad_norm", "epochs", "max_steps", "seed", "max_seq_len", "precision", "text_column",
                "text_pair_column", "label_column")


def config_changes(path: Path, config: dict[str, Any]) -> list[str]:
    """'name: saved -> now' for each run-defining setting that differs from the checkpoint's."""
    saved = json.loads((path / "meta.json").read_text()).get("config", {})
    return [f"{k}: {saved[k]!r} -> {config[k]!r}" for k in RUN_DEFINING if k in saved and saved[k] != config.get(k)]


def load_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, rank: int, world_size: int
) -> tuple[LoopState, str | None]:
    """Restore in place; returns the loop state and a warning if the rank count changed."""
    meta = json.loads((path / "meta.json").read_text())
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    except (RuntimeError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        was = meta.get("config", {}).get("model", "?")
        raise CoreCPUError(f"checkpoint {path} does not fit this model (it was written for --model {was}: {first}); "
                           "resume with the same --model, or start fresh in another --output-dir") from None
    scheduler.load_state_dict(state["scheduler"])
    warning = None
    rngs = state["rng"]
    if len(rngs) == world_size:
        set_rng_state(rngs[rank])
    else:
        warning = (f"checkpoint was written by {len(rngs)} ranks and this run has {world_size}: "
                   "data order and RNG streams will differ from an uninterrupted run")
    extra = {k: v for k, v in meta.items()
             if k not in ("step", "epoch", "batches_in_epoch", "world_size", "saved_at", "config")}
    loop = LoopState(meta["step"], meta["epoch"], meta["batches_in_epoch"], extra)
    return loop, warning
