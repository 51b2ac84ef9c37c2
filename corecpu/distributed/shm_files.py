"""Buffers in /dev/shm that every rank of one host maps, made collectively, with nothing left behind in the directory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Sequence

import torch


def map_shared(shm_dir: Path, prefix: str, entries: Sequence[tuple[str, int, torch.dtype]], rank: int,
               barrier: Callable[[], None]) -> list[torch.Tensor]:
    """Collective: buffers of zeros, (name, elements, dtype) each, in `shm_dir`, mapped by every rank, their files
    gone on return."""
    paths = [shm_dir / f"{prefix}-{name}" for name, _, _ in entries]
    try:
        if rank == 0:
            for path, (_, numel, dtype) in zip(paths, entries):
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
                try:
                    os.ftruncate(fd, max(numel, 1) * dtype.itemsize)
                finally:
                    os.close(fd)
        barrier()
        buffers = [torch.from_file(str(p), shared=True, size=max(numel, 1), dtype=dtype)[:numel]
                   for p, (_, numel, dtype) in zip(paths, entries)]
        barrier()
    finally:
        if rank == 0:
            for path in paths:
                path.unlink(missing_ok=True)
    return buffers


__all__ = ["map_shared"]
