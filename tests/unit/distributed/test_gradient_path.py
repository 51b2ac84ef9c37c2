"""Which gradient paths `--allreduce auto` may time: the candidates and when nothing is measured."""

from __future__ import annotations

from corecpu.cluster.launchers import detect_launcher
from corecpu.distributed import gradient_path

MPI = {"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}
TORCHRUN = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
YES, NO = (lambda: (True, "ok")), (lambda: (False, "missing"))


def test_ddp_own_path_comes_first_then_mpi_then_shared_memory() -> None:
    mpi = detect_launcher(MPI)
    assert gradient_path.candidates(mpi, "gloo", YES, YES) == ["gloo", "mpi", "shm"]
    assert gradient_path.candidates(mpi, "ccl", YES, NO) == ["ccl", "gloo", "mpi"]  # gloo always, to beat
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


def _remember(info, order, timings) -> None:
    from corecpu.distributed.allreduce_choice import remember

    remember(gradient_path._key(info, order), "unused", [timings, timings])


def test_auto_backend_keeps_ccl_until_a_cached_timing_sends_the_gradients_elsewhere(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CORECPU_CACHE_DIR", str(tmp_path))
    mpi = detect_launcher(MPI)
    # Nothing measured on this kind of machine yet: ccl starts, so that it can be timed with the others.
    assert gradient_path.cached_winner_without_ccl(mpi, YES, NO) == ""
    _remember(mpi, ["ccl", "gloo", "mpi"], {"ccl": 16.3, "gloo": 30.0, "mpi": 10.0})
    why = gradient_path.cached_winner_without_ccl(mpi, YES, NO)
    assert why.startswith("the gradients go over mpi here") and "ccl 16.3 ms" in why and "gloo starts faster" in why
    # A timing made with another candidate set (here: with shm) says nothing about this one.
    assert gradient_path.cached_winner_without_ccl(mpi, YES, YES) == ""
    _remember(mpi, ["ccl", "gloo", "mpi", "shm"], {"ccl": 8.0, "gloo": 30.0, "mpi": 10.0, "shm": 11.7})
    assert gradient_path.cached_winner_without_ccl(mpi, YES, YES) == ""  # ccl won: it stays


def test_after_ccl_was_skipped_the_timing_that_skipped_it_picks_the_path(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CORECPU_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(gradient_path._pg, "gather_objects", lambda obj: [obj, obj])  # two ranks, same view
    monkeypatch.setattr(gradient_path, "candidates", lambda info, backend: [backend, "mpi"])
    mpi = detect_launcher(MPI)
    _remember(mpi, ["ccl", "gloo", "mpi"], {"ccl": 16.3, "gloo": 30.0, "mpi": 10.0})
    choice, why, kept = gradient_path.settle("auto", "fp32", mpi, "gloo", None, "gloo", "x", ccl_skipped=True)
    assert (choice, kept) == ("mpi", None) and why.endswith("(cached)") and "ccl 16.3 ms" in why
