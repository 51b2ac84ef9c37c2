"""2 ranks under mpirun: MPI initialised as corecpu's comm threads initialise it, then run_cli's fast exit, rank
1 a second after rank 0. Each leaves a mark just before its exit."""

import os
import sys
import time
from pathlib import Path

from corecpu.distributed.mpi_init import init_mpi
from corecpu.errors import run_cli

marks = Path(sys.argv[1])


def main() -> int:
    rank = init_mpi().COMM_WORLD.Get_rank()
    if rank == 1:
        time.sleep(1.0)  # rank 0 reaches its exit first
    (marks / f"rank{rank}").write_text(str(os.getpid()))
    return 0


run_cli(main, fast_exit=True)
