"""Lines for people: one plain `corecpu: warning: ...` line, once per job or once per host; and, from the job's
first rank, what a slow start-up phase is doing (`say`, `phase`), so a log is never minutes of silence.

Python's `warnings.warn` prints the file and line of the call (`/.../precision.py:321: RuntimeWarning:`)
and every rank prints it again. A fact about the job (a flag, a setting) is said by rank 0; a fact about
a host (its cache directory, its HOME) by the first rank of each host.

    notices.warn("not caching ... ; set CORECPU_CACHE_DIR to a writable directory", per_host=True)
    with notices.phase("tokenizing 87,599 examples"):   # "tokenizing 87,599 examples..." then "...: 41.2 s"
        ...

This sits below corecpu.cluster, so it reads the launchers' rank variables itself: a process is the
first of its job (host) when every such variable present says 0. Nothing set means one process.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Iterator, Mapping

# The variables corecpu.cluster.launchers reads: torchrun/Kubeflow, Intel MPI/MPICH, Open MPI, MVAPICH, Slurm.
RANK_VARS = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID")
LOCAL_RANK_VARS = ("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK",
                   "SLURM_LOCALID")

_said: set[str] = set()


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> bool:
    # sbatch leaves SLURM_PROCID=0 in every rank mpirun starts inside it; a non-zero one of any kind decides.
    return all(env[n].strip() in ("", "0") for n in names if n in env)


def is_first(per_host: bool = False, env: Mapping[str, str] = os.environ) -> bool:
    """Whether this process speaks for the job (rank 0) or, with per_host, for its host (local rank 0)."""
    if per_host and any(n in env for n in LOCAL_RANK_VARS):
        return _first(env, LOCAL_RANK_VARS)
    return _first(env, RANK_VARS)


def warn(message: str, *, per_host: bool = False, env: Mapping[str, str] = os.environ) -> bool:
    """Print `corecpu: warning: <message>` on stderr, once per process and only from the job's (or with
    per_host, each host's) first rank. Returns whether it printed."""
    if message in _said or not is_first(per_host, env):
        return False
    _said.add(message)
    try:
        print(f"corecpu: warning: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        return False  # stderr closed (a launcher gone): nothing to tell
    return True


def say(message: str, *, env: Mapping[str, str] = os.environ) -> bool:
    """Print `message` on stdout, flushed (ranks write through the launcher's pipes), from the job's first rank
    only. Returns whether it printed."""
    if not is_first(False, env):
        return False
    try:
        print(message, flush=True)
    except (OSError, ValueError):
        return False
    return True


@contextlib.contextmanager
def phase(doing: str, *, env: Mapping[str, str] = os.environ) -> Iterator[None]:
    """`doing...` as a slow phase starts and `doing: N s` once it is done (rank 0); nothing more if it fails
    (its error says why)."""
    say(f"{doing}...", env=env)
    start = time.perf_counter()
    yield
    say(f"{doing}: {time.perf_counter() - start:.1f} s", env=env)
