"""The environment-variable contract between launch.sh / `corecpu launch`, `corecpu.bind` and the loop.

Every CORECPU_* variable corecpu reads or writes is named here, with who sets it and
who reads it, so the three stages cannot drift apart (launch.sh and tests/ipex_env.sh,
being shell, spell TORCH_INDEX and CACHE_DIR out; a test checks they match). Nothing
here imports torch.

`scoped(env, NAME=value, OTHER=None)` changes variables for one block and restores them exactly: for a
library that reads the real process environment (datasets, torch's cpp_extension, a C op), pass os.environ.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator, Mapping, MutableMapping

from corecpu import notices

# Set by corecpu.bind for the rank it execs; read by corecpu.cpu.threads / corecpu.setup().
BOUND_CPUS = "CORECPU_BOUND_CPUS"  # the rank's compute CPUs as a cpulist ("0-3,8"): bind already pinned it
PLAN_NOTE = "CORECPU_PLAN_NOTE"  # the plan's warnings and notes, for topology.json
COMM_CPU = "CORECPU_COMM_CPU"  # a CPU no rank computes on: the gradient all-reduce's comm thread pins itself there

# Set by corecpu.cpu.threads in the rank itself; read when topology.json is written.
THREADS_DECISION = "CORECPU_THREADS_DECISION"  # why this rank has the threads it has

# Set by the launcher; read by corecpu.bind (plans for it) and by the loop.
BACKEND = "CORECPU_BACKEND"  # the process-group backend asked for (auto|gloo|ccl|mpi): ccl reserves a worker core
TTY = "CORECPU_TTY"  # "1" when the launcher's stdout is a terminal: rank 0 may draw a progress bar
LAUNCHER_PID = "CORECPU_LAUNCHER_PID"  # `corecpu launch`'s PID: ranks on its host exit if it is killed (lifeline)
BINDING = "CORECPU_BINDING"  # core|numa: how tightly bind pins a rank (launch.sh decides it from --binding)
BINDING_REASON = "CORECPU_BINDING_REASON"  # why: the launcher's evidence (CPUs busy at start, exclusivity signs)
CPUS_BUSY = "CORECPU_CPUS_BUSY"  # the allowed CPUs launch.sh measured busy just before starting the ranks ("" = idle)
LOG_DIR = "CORECPU_LOG_DIR"  # --log-dir: corecpu.bind sends the rank's stdout and stderr to DIR/rank-N.log
LOG_REDIRECTS = "CORECPU_LOG_REDIRECTS"  # --redirects SPEC (torchrun's): streams to the file only, per local rank
LOG_TEE = "CORECPU_LOG_TEE"  # --tee SPEC (torchrun's): streams to the file and the console, per local rank
LOG_RANKS_FILTER = "CORECPU_LOG_RANKS_FILTER"  # --local-ranks-filter: only these local ranks on the console
JOB_DIR = "CORECPU_JOB_DIR"  # a directory per job where ranks on the launcher's host leave records (cluster.job_records)
MPI = "CORECPU_MPI"  # the MPI whose mpirun started the ranks, in people's words ("Open MPI 4.1.4", "MPICH 4.0.2")
RANKS_DECISION = "CORECPU_RANKS_DECISION"  # `auto`: the ranks per node chosen, and the samples/s it was chosen by

# Set by the user, read by the plan (corecpu.bind, setup()): the malloc ranks preload, auto|tcmalloc|jemalloc|system.
ALLOCATOR = "CORECPU_ALLOCATOR"
# Set by the user. Where corecpu caches (precision calibrations, tokenized data, the IPEX tier's env).
CACHE_DIR = "CORECPU_CACHE_DIR"
# Set by the user, read by launch.sh: a package index holding the CPU build of torch.
TORCH_INDEX = "CORECPU_TORCH_INDEX"
# Set by the user (CI: the vendored tarball), read by `corecpu build-ccl`: the oneCCL bindings' source, a
# directory, a tarball or a git URL@COMMIT (default: upstream), verified against the pinned SHA-256.
CCL_SOURCE = "CORECPU_CCL_SOURCE"
# Set by the user, read by tests/ccl (the DDP stress run): its number of steps (default 100; 2000 for the long run).
CCL_STRESS_STEPS = "CORECPU_CCL_STRESS_STEPS"
# Set by the user, read by test.sh: pytest workers for the whole suite (default 2; 0: one process).
TEST_WORKERS = "CORECPU_TEST_WORKERS"
# Set by the user, read by the ranks' reporting: "0" and the ranks do not read their CPUs' counters while training
# (corecpu.cpu.contention): no rank_cpu_* figures, and a run's samples/s goes to the rank-count history under its
# start's load state whatever ran beside it (the tests that hold a job's conditions equal under `pytest -n 2`).
WATCH_CPUS = "CORECPU_WATCH_CPUS"

# Set by the user, read by examples/slurm/train.sbatch: mpirun instead of srun, the script, the environment.
SBATCH_LAUNCHER, SBATCH_TRAIN, SBATCH_VENV = "CORECPU_LAUNCHER", "CORECPU_TRAIN", "CORECPU_VENV"

ALL = (MPI, RANKS_DECISION, BOUND_CPUS, PLAN_NOTE, COMM_CPU, THREADS_DECISION, BACKEND, BINDING, BINDING_REASON, CPUS_BUSY, TTY, LAUNCHER_PID, LOG_DIR, LOG_REDIRECTS, LOG_TEE,
       LOG_RANKS_FILTER, JOB_DIR, ALLOCATOR, CACHE_DIR, TORCH_INDEX, CCL_SOURCE,
       CCL_STRESS_STEPS, TEST_WORKERS, WATCH_CPUS, SBATCH_LAUNCHER, SBATCH_TRAIN, SBATCH_VENV)


def cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    """$CORECPU_CACHE_DIR, else $XDG_CACHE_HOME/corecpu, else ~/.cache/corecpu. A HOME that does not exist (a
    typo, a service account's) is not created: the cache goes under the temporary directory, said once per host."""
    if env.get(CACHE_DIR):
        return Path(env[CACHE_DIR])
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]) / "corecpu"
    home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    if home.is_dir():
        return home / ".cache" / "corecpu"
    fallback = Path(tempfile.gettempdir()) / f"corecpu-cache-{os.getuid()}"
    notices.warn(f"HOME ({home}) does not exist and is not created; caching measurements and tokenized data in "
                 f"{fallback} instead (set {CACHE_DIR} to choose the place)", per_host=True, env=env)
    return fallback


def _assign(env: MutableMapping[str, str], values: Mapping[str, str | None]) -> None:
    """Set each variable, or unset it where the value is None."""
    for k, v in values.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v


@contextlib.contextmanager
def scoped(env: MutableMapping[str, str], **changes: str | None) -> Iterator[MutableMapping[str, str]]:
    """Set (a string) or unset (None) each of `changes` in `env` for the block, then put back exactly what
    was there before, set or unset, also when the block raises. Changes `env` itself, so the process
    environment only when `env` is os.environ (whose writes reach C libraries and child processes)."""
    saved = {k: env.get(k) for k in changes}
    try:
        _assign(env, changes)
        yield env
    finally:
        _assign(env, saved)
