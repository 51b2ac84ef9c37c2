"""Which gradient paths `--allreduce auto` may time: the candidates and when nothing is measured."""

from __future__ import annotations

from corecpu.cluster.launchers import detect_launcher
from corecpu.training import gradient_path

MPI = {"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}
TORCHRUN = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
YES, NO = (lambda: (True, "ok")), (lambda: (False, "missing"))


def test_ddp_own_path_comes_first_then_mpi_then_shared_memory() -> None:
    mpi = detect_launcher(MPI)
    assert gradient_path.candidates(mpi, "gloo", YES, YES) == ["gloo", "mpi", "shm"]
    assert gradient_path.candidates(mpi, "ccl", YES, NO) == ["ccl", "mpi"]
    assert gradient_path.candidates(mpi, "gloo", NO, NO) == ["gloo"]
    # torchrun's ranks are no MPI world: the MPI hook cannot run there, the shared-memory op can.
    assert gradient_path.candidates(detect_launcher(TORCHRUN), "gloo", YES, YES) == ["gloo", "shm"]


def test_explicit_choices_bf16_wires_and_single_processes_are_not_measured() -> None:
    mpi = detect_launcher(MPI)
    assert gradient_path.settle("mpi", "fp32", mpi, "gloo", None, "mpi", "requested") == ("mpi", "requested", None)
    assert gradient_path.settle("auto", "bf16", mpi, "gloo", None, "gloo", "bf16") == ("gloo", "bf16", None)
    # --backend ccl named by the user keeps DDP's buckets on ccl; only --backend auto's ccl is timed.
    assert gradient_path.settle("auto", "fp32", mpi, "ccl", None, "ccl", "ddp", backend_requested="ccl") == \
        ("ccl", "ddp", None)
    one = detect_launcher({})
    assert gradient_path.settle("auto", "fp32", one, "gloo", None, "none", "single process")[2] is None
