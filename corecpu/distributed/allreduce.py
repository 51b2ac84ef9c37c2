"""Gradient all-reduce through MPI's shared-memory collectives, as a DDP communication hook.

When Intel MPI started the ranks, its intra-node Allreduce (mpi4py on impi-rt's libmpi)
is several times faster than gloo's for small buckets. Two things make it pay off
inside DDP:

- MPI runs on ONE dedicated comm thread, never inside the hook. A hook that calls MPI
  itself blocks the autograd thread and kills DDP's overlap of communication with the
  rest of backward (measured 1.7x slower steps). mpi4py releases the GIL during the
  call, and a single thread keeps the order of collectives identical on every rank
  (buckets are handed over in the order DDP fires them, which DDP keeps equal across ranks).
- gloo stays the process group for everything else (rendezvous, barriers, eval sums,
  all_gather_object); only gradient buckets go through MPI.

Gradients travel as fp32: Intel MPI has no bf16 sum.

    allreduce, why = choose_allreduce(cfg.allreduce, ctx.info, os.environ)
    if allreduce == "mpi":
        comm = MpiGradientAllreduce(ctx.info); comm.register(ddp)   # ... comm.close() at the end

Importing this module does not initialise MPI; the first MpiGradientAllreduce does.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import TYPE_CHECKING, Any, Callable, Mapping, MutableMapping

from corecpu.distributed import ALLREDUCE_CHOICES
from corecpu.errors import CoreCPUError
from corecpu.cluster.launchers import LaunchInfo
from corecpu.cpu.node_plan import NodePlan

if TYPE_CHECKING:
    import torch
    from torch.nn.parallel import DistributedDataParallel

WAIT_MODE_VAR = "I_MPI_WAIT_MODE"
# Intel MPI's own choice of all-reduce algorithm for 2 ranks on one host moved 32 MB no faster than
# gloo (29.8 vs 31.3 ms); the ring (8) took 19.4 ms, and 72 vs 116 ms at 128 MB, with 1 MB unchanged
# at 0.1 ms (benchmarks/allreduce.py, AMD EPYC, idle). Gradient buckets are MBs, so ring it is,
# unless the user chose an algorithm.
ALGORITHM_VAR, RING = "I_MPI_ADJUST_ALLREDUCE", "8"


def mpi4py_importable() -> tuple[bool, str]:
    """Whether mpi4py can be imported, without initialising MPI (only `mpi4py`, not `mpi4py.MPI`)."""
    import importlib.util

    if importlib.util.find_spec("mpi4py") is None:
        return False, "mpi4py is not installed"
    return True, "mpi4py found"


def choose_allreduce(
    requested: str,
    info: LaunchInfo,
    env: Mapping[str, str],
    mpi_available: Callable[[], tuple[bool, str]] = mpi4py_importable,
    backend: str = "gloo",
) -> tuple[str, str]:
    """("none" | "gloo" | "ccl" | "mpi", why). Pure apart from `mpi_available`.

    MPI is only usable when an MPI launcher started the ranks: under torchrun or srun
    every process would initialise MPI as a singleton of world size 1. gloo and ccl are
    DDP's own all-reduce on the process group (`backend`), so each needs that backend.
    """
    if requested not in ALLREDUCE_CHOICES:
        raise CoreCPUError(f"all-reduce {requested!r} is not one of: {', '.join(ALLREDUCE_CHOICES)}")
    if not info.distributed:
        return "none", "single process"
    if requested in ("gloo", "ccl"):
        if backend != requested:
            raise CoreCPUError(f"--allreduce {requested} runs DDP's all-reduce on the process group, which is "
                               f"{backend}; use --backend {requested} or --allreduce {backend}")
        return requested, "requested"
    launched_by_mpi = info.mpi_world
    ok, why = mpi_available() if launched_by_mpi else (False, "")
    if requested == "mpi":
        if not launched_by_mpi:
            raise CoreCPUError(
                f"MPI all-reduce needs ranks started by an MPI launcher (mpirun), but {info.launcher} started them; "
                "launch with mpirun (launch.sh does) or use the gloo all-reduce"
            )
        if not ok:
            raise CoreCPUError(f"MPI all-reduce needs mpi4py ({why}); pip install 'corecpu[mpi]', or use gloo")
        return "mpi", f"requested; started by {info.launcher}"
    if backend == "ccl":
        # A ccl process group was chosen (asked for, or auto with the bindings built): DDP uses it. Not yet a
        # measured choice against the MPI hook: benchmarks/allreduce.py times both, --allreduce mpi picks the hook.
        return "ccl", "DDP on the ccl process group (--allreduce mpi for the Intel MPI hook instead)"
    if not launched_by_mpi:
        return "gloo", f"started by {info.launcher}, not MPI"
    if not ok:
        return "gloo", f"started by {info.launcher} but {why}"
    if env.get(WAIT_MODE_VAR) == "1":
        return "mpi", f"started by {info.launcher}; {WAIT_MODE_VAR}=1 (oversubscribed)"
    return "mpi", f"started by {info.launcher}, {why}"


# ---------------------------------------------------------------- MPI set-up (I/O)


def apply_wait_mode(env: MutableMapping[str, str], plan_env: Callable[[], Mapping[str, str]]) -> str | None:
    """Copy I_MPI_WAIT_MODE from this node's plan (`plan_env()`, asked only when needed) into `env`
    unless the user or corecpu.bind set it.

    Must run before MPI_Init: Intel MPI reads it there. Returns the value set, if any.
    """
    if WAIT_MODE_VAR in env:
        return None
    value = plan_env().get(WAIT_MODE_VAR)
    if value is not None:
        env[WAIT_MODE_VAR] = value
    return value


def _init_mpi() -> Any:
    """mpi4py's MPI module, initialised with a thread level that allows calls from our comm thread."""
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


# ---------------------------------------------------------------- the comm thread and the hook


class MpiGradientAllreduce:
    """Averages DDP gradient buckets with MPI Allreduce on one dedicated daemon thread.

    The result is what DDP computes without a hook: each bucket is scaled by 1/world
    (the same fp32 multiply DDP's reducer applies) and summed. With 2 ranks the sum of
    two numbers does not depend on order, so parameters are bit-identical to gloo's path;
    with more ranks MPI and gloo may add in different orders (fp32 rounding differs).
    """

    def __init__(self, info: LaunchInfo, comm: Any = None, mpi: Any = None,
                 node: NodePlan | None = None) -> None:
        """`comm`/`mpi` (a communicator and the module giving IN_PLACE and SUM) replace MPI in tests.
        `node`: this node's plan, shared with corecpu.setup() (made here if not given)."""
        import torch.distributed as dist

        if comm is None:
            node = node or NodePlan(info, os.environ)
            apply_wait_mode(os.environ, lambda: node.env)  # only matters before MPI_Init, which happens next
            os.environ.setdefault(ALGORITHM_VAR, RING)
            mpi = _init_mpi()
            comm = mpi.COMM_WORLD
        self.comm = comm
        self._in_place, self._sum = mpi.IN_PLACE, mpi.SUM
        self.rank, self.world_size = comm.Get_rank(), comm.Get_size()
        expect = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (info.rank, info.world_size)
        if (self.rank, self.world_size) != expect:
            raise CoreCPUError(
                f"MPI says rank {self.rank} of {self.world_size} but torch.distributed says rank {expect[0]} of "
                f"{expect[1]}; start the ranks with one mpirun (not mpirun inside torchrun or srun), or use gloo"
            )
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="corecpu-mpi-allreduce", daemon=True)
        self._thread.start()

    def allreduce_async(self, tensor: torch.Tensor, scale: float | None = None) -> torch.futures.Future:
        """Sum `tensor` in place over all ranks (after multiplying by `scale`); the Future yields it.

        Every rank must call this in the same order with tensors of the same size and dtype.
        """
        import torch

        if not self._thread.is_alive():
            raise CoreCPUError("the MPI all-reduce thread has stopped (close() was called or it failed); "
                               "create a new MpiGradientAllreduce")
        fut: torch.futures.Future = torch.futures.Future()
        self._queue.put((tensor, scale, fut))
        return fut

    def register(self, ddp: DistributedDataParallel) -> None:
        """Install the communication hook: DDP hands each gradient bucket to the comm thread."""
        scale = 1.0 / self.world_size

        # No annotations: DDP compares them with the real classes, and this module's are strings.
        def mpi_allreduce_hook(state, bucket):  # type: ignore[no-untyped-def]
            return self.allreduce_async(bucket.buffer(), scale)

        ddp.register_comm_hook(None, mpi_allreduce_hook)

    def close(self) -> None:
        """Stop the comm thread after the queued all-reduces. MPI_Finalize at exit is mpi4py's."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def __enter__(self) -> "MpiGradientAllreduce":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            tensor, scale, fut = item
            try:
                result = self._reduce(tensor, scale)
            except BaseException as exc:  # the waiting backward must see it, whatever it is
                fut.set_exception(exc)
                continue
            fut.set_result(result)

    def _reduce(self, tensor: torch.Tensor, scale: float | None) -> torch.Tensor:
        import numpy as np
        import torch

        # fp32 on the wire: bf16 has no MPI sum, and numpy has no bf16 to view it through.
        wire = tensor if tensor.dtype == torch.float32 and tensor.is_contiguous() else tensor.float().contiguous()
        array = wire.numpy()
        if scale is not None:
            # DDP's reducer scales before summing too (and so avoids overflow). One correctly rounded
            # fp32 multiply either way; numpy's is single-threaded, so this thread starts no OpenMP team.
            np.multiply(array, np.float32(scale), out=array)
        self.comm.Allreduce(self._in_place, array, op=self._sum)
        if wire is not tensor:
            tensor.copy_(wire)
        return tensor


__all__ = ["ALLREDUCE_CHOICES", "MpiGradientAllreduce", "apply_wait_mode", "choose_allreduce", "mpi4py_importable"]
