"""Starting MPI for corecpu's comm threads (the MPI gradient hook; the shared-memory hook's leaders across hosts),
without initialising it on import, and only when one of them is used."""

from __future__ import annotations

import importlib.util
from typing import Any

from corecpu.errors import CoreCPUError


def mpi4py_importable() -> tuple[bool, str]:
    """Whether mpi4py can be imported, without initialising MPI (only `mpi4py`, not `mpi4py.MPI`)."""
    if importlib.util.find_spec("mpi4py") is None:
        return False, "mpi4py is not installed"
    return True, "mpi4py found"


def init_mpi() -> Any:
    """mpi4py's MPI module, initialised with a thread level that allows calls from our comm thread. Only a path
    that uses MPI calls it: MPI_Init holds the GIL and the import lock throughout (0.26 s for 2 ranks under Intel
    MPI, most of it waiting on the process manager), so started on a helper thread it overlapped nothing and
    stalled every rank, whatever path the job then took."""
    import mpi4py

    if not mpi4py.rc.initialize:
        raise CoreCPUError("mpi4py.rc.initialize is False, so MPI is never initialised; leave it True")
    # SERIALIZED is enough (only the comm thread calls MPI) and avoids MULTIPLE's locking.
    # rc is read only at the first import of mpi4py.MPI; if someone imported it earlier, check below.
    mpi4py.rc.thread_level = "serialized"
    from mpi4py import MPI

    provided = MPI.Query_thread()
    if provided < MPI.THREAD_SERIALIZED:
        names = {MPI.THREAD_SINGLE: "SINGLE", MPI.THREAD_FUNNELED: "FUNNELED"}
        raise CoreCPUError(
            f"MPI was initialised with thread level {names.get(provided, provided)}, but the all-reduce thread needs "
            "SERIALIZED or MULTIPLE; do not import mpi4py.MPI with mpi4py.rc.thread_level set lower"
        )
    return MPI


__all__ = ["init_mpi", "mpi4py_importable"]
