"""One read-only buffer per host that its first rank fills and every rank of the host maps from /dev/shm.

What it is for: copies every rank would otherwise make alike and keep privately, such as a frozen base's bf16 weights
(corecpu.compute.frozen_casts). With 4 ranks on a host and a 1B-parameter base, private copies are 4 x 2 GB; one
shared copy is 2 GB, and only one rank spends the time casting.

The ranks of a host are found by hostname, not by a placement rule, so any rank order works; the job's rank 0 names
the files, so two jobs on one host never meet. /dev/shm must hold the buffer with room to spare on every host, and
its pages are reserved before anything is written (tmpfs then reports a full disk as an error, not as a SIGBUS in the
middle of a copy); where a host has too little room, no rank shares and each keeps its own copy, so the job runs
either way. The file is unlinked before this returns: the mapping lives as long as the ranks, and nothing is left in
/dev/shm, even by a killed job.
"""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

SHM_DIR = Path("/dev/shm")
ROOM = 1.25  # /dev/shm must have this many times the buffer free: other jobs and corecpu's own step share it


def leaders(hosts: Sequence[str]) -> list[int]:
    """Pure: for each rank (its host's name, in rank order), the lowest rank on the same host."""
    first: dict[str, int] = {}
    return [first.setdefault(h, r) for r, h in enumerate(hosts)]


def shm_free(shm_dir: Path = SHM_DIR) -> int:
    """Bytes this process may write into `shm_dir` (0: none, or the directory is missing or not writable)."""
    try:
        st = os.statvfs(shm_dir)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize if os.access(shm_dir, os.W_OK) else 0


def host_copy(numel: int, dtype: torch.dtype, fill: Callable[[torch.Tensor], None], ok: bool, *, rank: int,
              gather: Callable[[Any], list[Any]], barrier: Callable[[], None], shm_dir: Path = SHM_DIR,
              free: Callable[[Path], int] = shm_free, hostname: Callable[[], str] = socket.gethostname,
              ) -> torch.Tensor | None:
    """Collective (every rank calls it): a flat buffer of `numel` `dtype` elements shared by this host's ranks, which
    the host's first rank has filled with `fill(buffer)` before any rank gets it; or None on every rank, where some
    rank passed `ok` False, some host's /dev/shm lacks room, or no host holds more than one rank."""
    nbytes = max(numel, 1) * dtype.itemsize
    views = gather((hostname(), ok and free(shm_dir) >= ROOM * nbytes, secrets.token_hex(8)))
    firsts = leaders([host for host, _, _ in views])
    if not all(room for _, room, _ in views) or len(set(firsts)) == len(firsts):
        return None
    leader = firsts[rank]
    path = shm_dir / f"corecpu-{views[0][2]}-r{leader}-copy"
    buffer: torch.Tensor | None = None
    try:
        if rank == leader:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                os.posix_fallocate(fd, 0, nbytes)  # tmpfs reserves the pages: ENOSPC now, not SIGBUS while filling
            finally:
                os.close(fd)
            buffer = torch.from_file(str(path), shared=True, size=max(numel, 1), dtype=dtype)[:numel]
            fill(buffer)
        barrier()  # filled
        if buffer is None:
            buffer = torch.from_file(str(path), shared=True, size=max(numel, 1), dtype=dtype)[:numel]
        barrier()  # every rank has it mapped: the name can go
    finally:
        if rank == leader:
            path.unlink(missing_ok=True)
    return buffer


__all__ = ["ROOM", "SHM_DIR", "host_copy", "leaders", "shm_free"]
