"""The choice of gradient all-reduce path, and the MPI path: MPI's shared-memory collectives as a DDP hook.

Paths (`choose_allreduce` picks one; `make_gradient_allreduce` builds its object, with `allreduce_async`,
`register(ddp)` and `close()`, so every path can be registered and timed alike):
- gloo, ccl: DDP's own all-reduce on the process group;
- mpi: below;
- shm: DeepSpeed's shared-memory op inside a host, hierarchical across hosts (corecpu.distributed.shm_allreduce).

When MPI started the ranks, its intra-node Allreduce (mpi4py on impi-rt's libmpi, or on Open MPI's when
its mpirun started them: corecpu.launching.mpirun) is several times faster than gloo's for small buckets.
Two things make it pay off inside DDP:

- MPI runs on ONE dedicated comm thread (corecpu.distributed.comm_thread), never inside the hook.
  mpi4py releases the GIL during the call.
- gloo stays the process group for everything else (rendezvous, barriers, eval sums,
  all_gather_object); only gradient buckets go through MPI.

Gradients travel as fp32: Intel MPI has no bf16 sum.

    path, why = choose_allreduce(opts.allreduce, info, env, backend=pg.backend, dtype=opts.allreduce_dtype)
    comm = make_gradient_allreduce(path, info, node, wire=opts.allreduce_dtype); comm.register(ddp)  # close() at the end

Importing this module does not initialise MPI; the first MpiGradientAllreduce does.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Mapping, MutableMapping, Protocol

from corecpu.distributed import ALLREDUCE_CHOICES, ALLREDUCE_DTYPES
from corecpu.distributed.comm_thread import ThreadedGradientAllreduce, comm_cpu_of
from corecpu.distributed.mpi_init import init_mpi, mpi4py_importable
from corecpu.distributed.shm_allreduce import ShmGradientAllreduce, shm_status
from corecpu.errors import CoreCPUError, install_extra
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


def choose_allreduce(
    requested: str,
    info: LaunchInfo,
    env: Mapping[str, str],
    mpi_available: Callable[[], tuple[bool, str]] = mpi4py_importable,
    backend: str = "gloo",
    dtype: str = "fp32",
    shm_available: Callable[[], tuple[bool, str]] | None = None,
) -> tuple[str, str]:
    """("none" | "gloo" | "ccl" | "mpi" | "shm", why). Pure apart from `mpi_available` and `shm_available`.

    MPI is only usable when an MPI launcher started the ranks: under torchrun or srun
    every process would initialise MPI as a singleton of world size 1. gloo and ccl are
    DDP's own all-reduce on the process group (`backend`), so each needs that backend.
    shm (DeepSpeed's shared-memory op, corecpu.distributed.shm_allreduce) works under any launcher, but
    only when asked for: auto does not pick it until start-up measurements can show it is faster.
    `dtype` is what buckets travel as; MPI has no bf16 sum.
    """
    if requested not in ALLREDUCE_CHOICES:
        raise CoreCPUError(f"all-reduce {requested!r} is not one of: {', '.join(ALLREDUCE_CHOICES)}")
    if dtype not in ALLREDUCE_DTYPES:
        raise CoreCPUError(f"all-reduce dtype {dtype!r} is not one of: {', '.join(ALLREDUCE_DTYPES)}")
    if not info.distributed:
        return "none", "single process"
    if requested == "shm":
        ok, why = (shm_available or shm_status)()
        if not ok:
            raise CoreCPUError(f"the shared-memory all-reduce cannot run here: {why}; or use --allreduce gloo")
        return "shm", f"requested; {why}"
    if requested == "mpi" and dtype != "fp32":
        raise CoreCPUError(f"MPI has no {dtype} sum, so the MPI all-reduce sends fp32; use --allreduce-dtype fp32, "
                           f"or --allreduce shm or gloo for {dtype} on the wire")
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
            raise CoreCPUError(f"MPI all-reduce needs mpi4py ({why}); {install_extra('mpi')}, or use gloo")
        return "mpi", f"requested; started by {info.launcher}"
    if backend == "ccl":
        # A ccl process group was chosen (asked for, or auto with the bindings built): DDP uses it. Under
        # --backend auto, distributed.gradient_path then times it against the hooks; --backend ccl keeps it.
        return "ccl", "DDP on the ccl process group (--allreduce mpi for the Intel MPI hook instead)"
    if not launched_by_mpi:
        return "gloo", f"started by {info.launcher}, not MPI"
    if dtype != "fp32":
        return "gloo", f"{dtype} on the wire, which MPI cannot sum"
    if not ok:
        return "gloo", f"started by {info.launcher} but {why}"
    if env.get(WAIT_MODE_VAR) == "1":
        return "mpi", f"started by {info.launcher}; {WAIT_MODE_VAR}=1 (MPI waits sleep: see `corecpu plan`)"
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


# ---------------------------------------------------------------- the comm thread and the hook


class MpiGradientAllreduce(ThreadedGradientAllreduce):
    """Averages DDP gradient buckets with MPI Allreduce on the comm thread (corecpu.distributed.comm_thread).

    With 2 ranks the sum of two numbers does not depend on order, so parameters are bit-identical to
    gloo's path; with more ranks MPI and gloo may add in different orders (fp32 rounding differs).
    """

    label = "MPI all-reduce"

    def __init__(self, info: LaunchInfo, comm: Any = None, mpi: Any = None,
                 node: NodePlan | None = None) -> None:
        """`comm`/`mpi` (a communicator and the module giving IN_PLACE and SUM) replace MPI in tests.
        `node`: this node's plan, shared with corecpu.setup() (made here if not given)."""
        import torch.distributed as dist

        # The node plan's environment is setup()'s `env` (the process's own unless a test passed another): the
        # MPI settings go there, and the comm CPU that corecpu.bind or setup() put there is read from it.
        node = node or NodePlan(info, os.environ)
        if comm is None:
            apply_wait_mode(node.environ, lambda: node.env)  # only matters before MPI_Init, which happens next
            node.environ.setdefault(ALGORITHM_VAR, RING)
            mpi = init_mpi()
            comm = mpi.COMM_WORLD
        self.comm = comm
        self._in_place, self._sum = mpi.IN_PLACE, mpi.SUM
        self.rank, world_size = comm.Get_rank(), comm.Get_size()
        expect = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (info.rank, info.world_size)
        if (self.rank, world_size) != expect:
            raise CoreCPUError(world_mismatch(self.rank, world_size, expect, info.launcher, library_of(mpi)))
        super().__init__(world_size, "corecpu-mpi-allreduce", comm_cpu_of(node.environ))

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


def library_of(mpi: Any) -> str:
    """The first line of the MPI library's own name for itself ("Open MPI v4.1.4, ...", "Intel(R) MPI Library
    2021.18.1 for Linux* OS"), or "" where the module cannot say (a test's stand-in)."""
    try:
        return str(mpi.Get_library_version()).strip().splitlines()[0].split(",")[0]
    except (AttributeError, IndexError):
        return ""


def world_mismatch(rank: int, size: int, expect: tuple[int, int], launcher: str, library: str) -> str:
    """Pure: the one line for an MPI world that is not torch.distributed's. A world of one under an MPI launcher is
    mpi4py on another MPI than the one that started the ranks (each rank then starts MPI alone)."""
    said = f"MPI says rank {rank} of {size} but torch.distributed says rank {expect[0]} of {expect[1]}"
    if size == 1 and expect[1] > 1 and launcher in ("openmpi", "intel-mpi", "mvapich"):
        other = f"mpi4py loaded {library}" if library else "mpi4py loaded another MPI"
        return (f"{said}: {other}, not the MPI of the {launcher} launcher that started the ranks; point mpi4py at "
                "that MPI's libmpi (MPI4PY_LIBMPI, which corecpu launch sets for Open MPI), or use --allreduce gloo")
    return f"{said}; start the ranks with one mpirun (not mpirun inside torchrun or srun), or use gloo"


# ---------------------------------------------------------------- every path behind one interface


class GradientAllreduce(Protocol):
    """What each path offers: DDP registration, and a direct all-reduce for timing it (a start-up
    measurement or benchmarks/allreduce.py calls `allreduce_async(t, 1 / world).wait()` on every rank)."""

    def allreduce_async(self, tensor: torch.Tensor, scale: float | None = None) -> torch.futures.Future: ...

    def register(self, ddp: DistributedDataParallel) -> None: ...

    def close(self) -> None: ...


class ProcessGroupAllreduce:
    """DDP's own all-reduce on the process group (gloo or ccl): for bf16 on the wire, torch's
    bf16_compress_hook; for fp32 nothing is registered and DDP runs exactly as without corecpu.
    `group`: a gloo group beside a ccl default group (gloo won the timing there); DDP's buckets then
    go over it through torch's own allreduce hook."""

    def __init__(self, wire: str = "fp32", group: Any = None) -> None:
        import torch

        if wire not in ALLREDUCE_DTYPES:
            raise CoreCPUError(f"all-reduce dtype {wire!r} is not one of: {', '.join(ALLREDUCE_DTYPES)}")
        self.wire = torch.float32 if wire == "fp32" else torch.bfloat16
        self.group = group

    def allreduce_async(self, tensor: torch.Tensor, scale: float | None = None) -> torch.futures.Future:
        import torch.distributed as dist

        if scale is not None:
            tensor.mul_(scale)
        work = tensor if tensor.dtype == self.wire else tensor.to(self.wire)
        fut = dist.all_reduce(work, group=self.group, async_op=True).get_future()
        return fut.then(lambda _: tensor if work is tensor else tensor.copy_(work))

    def register(self, ddp: DistributedDataParallel) -> None:
        import torch
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook, bf16_compress_hook

        if self.wire == torch.bfloat16:
            def bf16_on_the_wire(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks real annotations only
                return bf16_compress_hook(state, bucket)

            # torch refuses `bf16_compress_hook` by its name unless CUDA or XPU is there; the hook itself runs on
            # CPU (gloo sums bf16), so it is registered under another name.
            ddp.register_comm_hook(self.group, bf16_on_the_wire)
        elif self.group is not None:
            ddp.register_comm_hook(self.group, allreduce_hook)

    def close(self) -> None:
        pass


def gloo_beside(default_backend: str) -> Any:
    """Collective: None where the default group is gloo already, else a new gloo group of every rank."""
    import torch.distributed as dist

    return None if default_backend == "gloo" else dist.new_group(backend="gloo")


def make_gradient_allreduce(path: str, info: LaunchInfo, node: NodePlan | None = None,
                            wire: str = "fp32") -> GradientAllreduce:
    """The object for one all-reduce `path` ("gloo" | "ccl" | "mpi" | "shm", as choose_allreduce names them),
    `wire` fp32 or bf16. A collective for mpi and shm: every rank calls it at the same point. Raises
    CoreCPUError (one line) where the path cannot run, so a caller may fall back to another."""
    if path == "gloo":
        import torch.distributed as dist

        return ProcessGroupAllreduce(wire, gloo_beside(dist.get_backend()))
    if path == "ccl":
        return ProcessGroupAllreduce(wire)
    if path == "mpi":
        if wire != "fp32":
            raise CoreCPUError(f"MPI has no {wire} sum, so the MPI all-reduce sends fp32; use --allreduce-dtype fp32")
        return MpiGradientAllreduce(info, node=node)
    if path == "shm":
        return ShmGradientAllreduce(info, wire, comm_cpu=comm_cpu_of(node.environ) if node else None)
    raise CoreCPUError(f"no gradient all-reduce object for {path!r}; use one of gloo, ccl, mpi, shm")


__all__ = ["ALLREDUCE_CHOICES", "GradientAllreduce", "MpiGradientAllreduce", "ProcessGroupAllreduce", "apply_wait_mode",
           "choose_allreduce", "make_gradient_allreduce", "mpi4py_importable"]
