"""Several ranks of a worker script (helpers/workers/) as plain processes with torchrun's variables, or under
Intel MPI's mpirun."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest

from helpers.common import ROOT, WORKERS, free_port

needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun on PATH (pip install impi-rt)")


def spawn(script: str, world: int, *args: str, timeout: float = 180,
          local_world: int | None = None) -> list[subprocess.CompletedProcess]:
    """`local_world` ranks per "host" (default all on one): the local ranks and sizes torchrun would give."""
    port, local = str(free_port()), local_world or world
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank % local),
               "LOCAL_WORLD_SIZE": str(local), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
               "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        procs.append(subprocess.Popen([sys.executable, str(WORKERS / script), *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return results


def mpirun(script: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """2 ranks of `script` under mpirun (its own session, so a hung job is killed whole: mpirun, hydra, ranks)."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT)}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(var, None)
    proc = subprocess.Popen(["mpirun", "-n", "2", sys.executable, str(WORKERS / script), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"mpirun {script} {' '.join(args)} did not end within {timeout:g}s")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
