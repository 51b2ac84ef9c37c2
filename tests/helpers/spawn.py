"""Several ranks of a worker script (helpers/workers/) as plain processes with torchrun's variables."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers.common import ROOT, WORKERS, free_port


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
