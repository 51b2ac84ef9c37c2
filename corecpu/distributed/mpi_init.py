"""Starting MPI for corecpu's comm threads (the MPI gradient hook; the shared-memory hook's leaders across hosts),
without initialising it on import."""

from __future__ import annotations

import importlib.util
import threading
from typing import Any, Mapping

from corecpu.errors import CoreCPUError


def mpi4py_importable() -> tuple[bool, str]:
    """Whether mpi4py can be imported, without initialising MPI (only `mpi4py`, not `mpi4py.MPI`)."""
    if importlib.util.find_spec("mpi4py") is None:
        return False, "mpi4py is not installed"
    return True, "mpi4py found"


_early: threading.Thread | None = None


def start_early(env: Mapping[str, str]) -> bool:
    """Start MPI_Init on a helper thread, so it overlaps loading the model and data; init_mpi() then waits
    for it. MPI_Init took 0.3-0.5 s for 2 ranks under Intel MPI (2-vCPU Xeon), mostly waiting on the process
    manager. Only where nothing in MPI_Init binds the calling thread (I_MPI_PIN=0, as launch.sh runs, since
    corecpu.bind pins): pinning from a helper thread would pin that thread alone. False if not started."""
    global _early
    if _early is not None or env.get("I_MPI_PIN") != "0" or not mpi4py_importable()[0]:
        return False

    def init() -> None:
        try:
            init_mpi()
        except Exception:  # noqa: BLE001 (init_mpi on the main thread raises it again, with its message)
            pass

    _early = threading.Thread(target=init, name="corecpu-mpi-init", daemon=True)
    _early.start()
    return True


def init_mpi() -> Any:
    """mpi4py's MPI module, initialised with a thread level that allows calls from our comm thread."""
    if _early is not None and _early is not threading.current_thread():
        _early.join()
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
