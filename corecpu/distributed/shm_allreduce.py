"""Gradient all-reduce over shared memory with DeepSpeed's CPU op, as a DDP comm hook; hierarchical across hosts.

DeepSpeed's `ShareMemCommBuilder` op sums a tensor over the processes of one host through /dev/shm
segments, with AVX-512/AVX2 kernels: 11.4 ms for 32 MB fp32 between 2 ranks where gloo took 30.0 ms
(issue 16). corecpu uses the op as it is (the `shm` extra installs DeepSpeed) and adds what DDP training
needs around it:

- It runs on the one comm thread of corecpu.distributed.comm_thread, like the MPI hook.
- Across hosts it is hierarchical: the ranks of each host sum over shared memory, the local-rank-0
  processes ("leaders") sum across hosts (over MPI when MPI started the ranks and mpi4py is there, else a
  gloo group of the leaders), and the leader shares the total with its host by a second shared-memory
  sum in which the other ranks contribute zeros (adding zeros is exact).
- Each host gets its own shared-memory namespace: the op names its segments after the strings it reads
  from MASTER_ADDR/MASTER_PORT, which every host of a job shares, so two "hosts" that share one /dev/shm
  (network namespaces, containers) would otherwise open each other's segments. Once every rank has mapped
  them the names are unlinked, so a job leaves nothing in /dev/shm, even when it is killed.
- bf16 on the wire (`wire="bf16"`) halves the bytes: buckets are scaled in fp32, rounded to bf16, summed
  by the op (which adds in fp32 and rounds once), and copied back. The leg across hosts travels as fp32.

The op's limits, which the checks here turn into one-line errors: SUM only; fp32/bf16/fp16 (anything else
it silently leaves unreduced); blocking; one group per process (a second initialize is ignored by the op).

The op is compiled by torch's cpp_extension once per environment (about a minute), into
~/.cache/corecpu/shm/<torch, DeepSpeed and Python versions>/; `python -m corecpu.distributed.shm_allreduce`
builds it ahead of a job.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from corecpu import atomic, envvars
from corecpu.cluster.launchers import LaunchInfo
from corecpu.distributed import ALLREDUCE_DTYPES
from corecpu.distributed.comm_thread import ThreadedGradientAllreduce
from corecpu.distributed.mpi_init import init_mpi
from corecpu.distributed.process_group import barrier, gather_objects
from corecpu.errors import CoreCPUError, install_extra

if TYPE_CHECKING:
    import torch

SEGMENT_PREFIX = "deepspeed_allreduce_buffer"  # the op's shm_open name: <prefix>_<uid>_<addr>_<port>_<rank>
PORT_FIELD = "grad"  # the op's "port" part of the name; the namespace (its "addr" part) is what differs
# The op's kernel levels (its vector_kernel_level()): 2 has the bf16/fp16 kernels, 1 fp32 only.
KERNEL_LEVEL_BF16, KERNEL_LEVEL_FP32 = 2, 1


# ---------------------------------------------------------------- can it be used here (pure apart from the probes)


def shm_status(cpu_flags: Callable[[], set[str]] | None = None,
               find_module: Callable[[str], Any] = importlib.util.find_spec,
               which: Callable[[str], str | None] = shutil.which) -> tuple[bool, str]:
    """(usable, why) without building or importing the op: DeepSpeed installed, a C++ compiler, and a CPU
    with the AVX2 the op's fp32 kernels need. Linux x86-64 only (the op's ISA probe exists there alone)."""
    if not sys.platform.startswith("linux"):
        return False, f"the shared-memory op is Linux-only (this is {sys.platform})"
    if find_module("deepspeed") is None:
        return False, "DeepSpeed is not installed (pip install 'corecpu[shm]')"
    compiler = os.environ.get("CXX") or "c++"
    if which(compiler) is None:
        return False, f"no C++ compiler ({compiler}) to build DeepSpeed's shared-memory op; install g++"
    flags = (cpu_flags or _cpu_flags)()
    if "avx2" not in flags and "avx512bw" not in flags:
        return False, "the CPU has neither AVX2 nor AVX-512, which DeepSpeed's shared-memory kernels need"
    return True, "DeepSpeed's shared-memory op" + ("" if "avx512bw" in flags else " (AVX2: fp32 only)")


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def op_cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    """Where torch's cpp_extension builds the op: one build per torch, DeepSpeed and Python version."""
    import torch

    # The installed version, read without importing DeepSpeed (its import is slow and logs).
    try:
        deepspeed = metadata.version("deepspeed")
    except metadata.PackageNotFoundError:
        raise CoreCPUError(f"DeepSpeed's shared-memory op needs deepspeed, which is not installed; "
                           f"{install_extra('shm')}, or use --allreduce gloo") from None
    key = f"torch-{torch.__version__}-deepspeed-{deepspeed}-py{sys.version_info[0]}{sys.version_info[1]}"
    return envvars.cache_dir(env) / "shm" / re.sub(r"[^A-Za-z0-9._-]", "_", key)


OP_NAME = "deepspeed_shm_comm"  # ShareMemCommBuilder.NAME: the extension module and its build folder
_STAMP = "corecpu-built.json"  # beside the op: the .so a successful load left, as (size, mtime)


def import_builder() -> Any:
    """DeepSpeed's ShareMemCommBuilder class. Told the accelerator, DeepSpeed's import does not print on every rank
    that it "was unable to detect" a GPU and chose the CPU (a user's own DS_ACCELERATOR is kept); it asks once,
    at import, and keeps the answer."""
    try:
        with envvars.scoped(os.environ, DS_ACCELERATOR=os.environ.get("DS_ACCELERATOR", "cpu")):
            from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder
    except ImportError as exc:
        raise CoreCPUError(f"DeepSpeed's shared-memory op cannot be imported ({exc}); "
                           f"{install_extra('shm')}, or use --allreduce gloo") from exc
    return ShareMemCommBuilder


def load_op(verbose: bool = False) -> Any:
    """DeepSpeed's shared-memory op, built on first use in this environment and loaded from the cache after.

    Ranks that call this together wait for one build (cpp_extension locks the build directory). Once a load
    through DeepSpeed has succeeded, later ones import the built module directly: `import deepspeed` (which
    the builder needs) took 3.5 s of every rank's start on the 2-vCPU EPYC, and the build has no CPU-specific
    flags (-O2 -fopenmp; its kernels pick their ISA at run time), so the module is the builder's own."""
    build_dir = op_cache_dir()
    if not verbose and (op := _load_built(build_dir / OP_NAME)) is not None:
        return op
    builder = import_builder()
    build_dir.mkdir(parents=True, exist_ok=True)
    # cpp_extension.load reads TORCH_EXTENSIONS_DIR; the builder takes no path. Always the ninja installed beside
    # this Python (DeepSpeed's dependency): ninja versions hash commands differently, so a system ninja one time
    # and this one the next would rebuild the op every time.
    path = os.pathsep.join(filter(None, [str(Path(sys.executable).parent), os.environ.get("PATH")]))
    with envvars.scoped(os.environ, TORCH_EXTENSIONS_DIR=str(build_dir), PATH=path):
        try:
            op = builder().load(verbose=verbose)
        except Exception as exc:  # a compiler error is long: its last line says which
            last = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
            raise CoreCPUError(f"building DeepSpeed's shared-memory op in {build_dir} failed ({last}); "
                               "run `python -m corecpu.distributed.shm_allreduce` to see the build log, or use "
                               "--allreduce gloo") from exc
    _stamp_built(build_dir / OP_NAME, op)
    return op


def _built_file(folder: Path) -> tuple[Path, list[int]] | None:
    so = folder / f"{OP_NAME}.so"
    try:
        st = so.stat()
    except OSError:
        return None
    return so, [st.st_size, st.st_mtime_ns]


def _stamp_built(folder: Path, op: Any) -> None:
    """Record the .so that just loaded (only the builder's own build: a module from elsewhere is not stamped)."""
    found = _built_file(folder)
    if found is None or Path(getattr(op, "__file__", "") or "").resolve() != found[0].resolve():
        return
    try:
        atomic.write_json(folder / _STAMP, {"so": found[1]})
    except OSError:
        pass  # a read-only cache: every load goes through DeepSpeed, as before


def _load_built(folder: Path) -> Any | None:
    """The module a previous load through DeepSpeed stamped, if its .so is unchanged since (a rebuild, or a
    build still being written, changes it); None: load through DeepSpeed."""
    found = _built_file(folder)
    try:
        stamped = json.loads((folder / _STAMP).read_text()).get("so")
    except (OSError, ValueError, AttributeError):
        return None
    if found is None or stamped != found[1]:
        return None
    import torch  # noqa: F401  (the module links against torch's libraries, loaded by importing torch)

    if OP_NAME in sys.modules:
        return sys.modules[OP_NAME]
    spec = importlib.util.spec_from_file_location(OP_NAME, found[0])
    if spec is None or spec.loader is None:
        return None
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (ImportError, OSError):
        return None
    sys.modules[OP_NAME] = module
    return module


# ---------------------------------------------------------------- names and groups (pure)


def shm_namespace(job_token: str, node_index: int, hostname: str) -> str:
    """The op's "address" for one host of one job: unique per job (rank 0's token) and per host (node index
    and hostname), with only the characters a POSIX shm name may hold."""
    host = re.sub(r"[^A-Za-z0-9.-]", "-", hostname.split(".")[0])[:40] or "host"
    return f"corecpu-{re.sub(r'[^A-Za-z0-9-]', '-', job_token)}-n{node_index}-{host}"


def segment_name(namespace: str, local_rank: int, uid: int) -> str:
    """The op's shm_open name for one rank's segment (shm.cpp: <prefix>_<uid>_<addr>_<port>_<rank>)."""
    return f"{SEGMENT_PREFIX}_{uid}_{namespace}_{PORT_FIELD}_{local_rank}"


def host_layout(info: LaunchInfo) -> tuple[int, list[int]]:
    """(number of hosts, the global rank of each host's local rank 0), for the block placement every launcher
    here uses: host k holds ranks k*local_size .. (k+1)*local_size-1."""
    if info.world_size % info.local_world_size:
        raise CoreCPUError(f"{info.world_size} ranks do not split into hosts of {info.local_world_size}; the "
                           "shared-memory all-reduce needs the same number of ranks on every host")
    hosts = info.world_size // info.local_world_size
    return hosts, [k * info.local_world_size for k in range(hosts)]


def check_wire(wire: str, kernel_level: int) -> None:
    """One line when the op's kernels on this CPU cannot sum `wire`."""
    if wire not in ALLREDUCE_DTYPES:
        raise CoreCPUError(f"all-reduce dtype {wire!r} is not one of: {', '.join(ALLREDUCE_DTYPES)}")
    if wire == "bf16" and kernel_level < KERNEL_LEVEL_BF16:
        raise CoreCPUError("the shared-memory op sums bf16 with AVX-512 only, which this CPU lacks; "
                           "use --allreduce-dtype fp32")
    if kernel_level < KERNEL_LEVEL_FP32:
        raise CoreCPUError("the shared-memory op has no kernels for this CPU (needs AVX2); use --allreduce gloo")


# ---------------------------------------------------------------- the leaders' leg across hosts


class _MpiLeaders:
    """Sums fp32 tensors among the leaders over an MPI communicator of theirs (made collectively, here)."""

    def __init__(self, is_leader: bool) -> None:
        mpi = init_mpi()
        self._mpi = mpi
        self._comm = mpi.COMM_WORLD.Split(0 if is_leader else mpi.UNDEFINED, mpi.COMM_WORLD.Get_rank())

    def allreduce_(self, tensor: torch.Tensor) -> None:
        self._comm.Allreduce(self._mpi.IN_PLACE, tensor.numpy(), op=self._mpi.SUM)


class _GlooLeaders:
    """Sums fp32 tensors among the leaders over a gloo group of theirs (every rank takes part in making it)."""

    def __init__(self, leaders: list[int]) -> None:
        import torch.distributed as dist

        self._group = dist.new_group(ranks=leaders, backend="gloo")

    def allreduce_(self, tensor: torch.Tensor) -> None:
        import torch.distributed as dist

        dist.all_reduce(tensor, group=self._group)


# ---------------------------------------------------------------- the hook

_INITIALIZED: tuple[int, int, str] | None = None  # the op's one group in this process: (size, rank, namespace)


class ShmGradientAllreduce(ThreadedGradientAllreduce):
    """Averages DDP gradient buckets over shared memory inside each host, and across hosts between leaders.

    With 2 ranks on one host the sum of two numbers does not depend on order, so parameters are
    bit-identical to gloo's path (fp32 wire); otherwise the adding order differs from gloo's (fp32 rounding).
    A collective: every rank constructs it, in the same order relative to other collectives.
    """

    label = "shared-memory all-reduce"

    def __init__(self, info: LaunchInfo, wire: str = "fp32", use_mpi: bool | None = None,
                 comm_cpu: int | None = None) -> None:
        """`wire`: fp32 or bf16 on the wire. `use_mpi`: the leaders' leg over MPI (default: when MPI started
        the ranks and mpi4py is installed), else over gloo. `comm_cpu`: where the comm thread runs (see
        ThreadedGradientAllreduce). Needs the gloo process group (setup())."""
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            raise CoreCPUError("the shared-memory all-reduce needs torch.distributed initialised; call "
                               "corecpu.setup() first")
        if wire not in ALLREDUCE_DTYPES:
            raise CoreCPUError(f"all-reduce dtype {wire!r} is not one of: {', '.join(ALLREDUCE_DTYPES)}")
        self.hosts, leaders = host_layout(info)
        self.local_size, self.local_rank = info.local_world_size, info.local_rank
        self.is_leader = info.local_rank == 0
        self.wire, self.wire_name = (torch.float32 if wire == "fp32" else torch.bfloat16), wire
        self.namespace = ""
        if self.local_size > 1:
            self._init_op(info, wire)
        self.leaders: _MpiLeaders | _GlooLeaders | None = None
        if self.hosts > 1:
            if use_mpi is None:
                use_mpi = info.mpi_world and importlib.util.find_spec("mpi4py") is not None
            self.leaders = _MpiLeaders(self.is_leader) if use_mpi else _GlooLeaders(leaders)
            self.leader_transport = "mpi" if use_mpi else "gloo"
        super().__init__(info.world_size, "corecpu-shm-allreduce", comm_cpu)

    def describe(self) -> str:
        """How buckets travel, for the start-up line."""
        local = f"shared memory among {self.local_size} rank(s) per host" if self.local_size > 1 else "1 rank per host"
        across = f", {self.hosts} hosts' leaders over {self.leader_transport}" if self.hosts > 1 else ""
        return f"{local}{across}, {self.wire_name} on the wire"

    def _init_op(self, info: LaunchInfo, wire: str) -> None:
        global _INITIALIZED
        import torch.distributed as dist

        try:
            op, error = load_op(), None
        except CoreCPUError as exc:
            op, error = None, str(exc)
        # Every rank learns whether every rank has the op: a rank without it would leave its peers spinning
        # forever in initialize() (the op waits for every segment to appear).
        errors = [e for e in gather_objects(error) if e]
        if errors:
            raise CoreCPUError(errors[0] if error else f"another rank could not load the op: {errors[0]}")
        check_wire(wire, op.vector_kernel_level())
        token = [f"{os.getpid():x}{os.urandom(3).hex()}" if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(token, src=0)
        self.namespace = shm_namespace(str(token[0]), info.node_rank, socket.gethostname())
        group = (self.local_size, self.local_rank)
        if _INITIALIZED is not None:
            if _INITIALIZED[:2] != group:
                raise CoreCPUError(f"DeepSpeed's shared-memory op serves one group per process (here local rank "
                                   f"{_INITIALIZED[1]} of {_INITIALIZED[0]}); start a new process for another")
            self.namespace = _INITIALIZED[2]  # the op keeps its first group; its segments are still mapped
            return
        # The op reads its group from these variables in initialize(); set only for that call.
        with envvars.scoped(os.environ, LOCAL_SIZE=str(self.local_size), MASTER_ADDR=self.namespace,
                            MASTER_PORT=PORT_FIELD):
            op.initialize(self.local_size, self.local_rank)
        _INITIALIZED = (self.local_size, self.local_rank, self.namespace)
        barrier()  # every rank has mapped every segment of its host: the names can go
        try:
            os.unlink(Path("/dev/shm") / segment_name(self.namespace, self.local_rank, os.getuid()))
        except FileNotFoundError:
            pass

    def _reduce(self, tensor: torch.Tensor, scale: float | None) -> torch.Tensor:
        import numpy as np
        import torch

        fp32 = tensor.dtype == torch.float32 and tensor.is_contiguous()
        work = tensor if fp32 else tensor.float().contiguous()
        if scale is not None:
            # Before the sum, as DDP's reducer does; numpy's multiply is single-threaded, so this thread starts
            # no OpenMP team of its own here.
            np.multiply(work.numpy(), np.float32(scale), out=work.numpy())
        wire = work if self.wire == torch.float32 else work.to(self.wire)
        if self.local_size > 1:
            torch.ops.deepspeed.inference_all_reduce_(wire)
        if self.leaders is not None:
            if self.is_leader:
                leg = wire if wire.dtype == torch.float32 else wire.float()
                self.leaders.allreduce_(leg)
                if leg is not wire:
                    wire.copy_(leg)
            if self.local_size > 1:
                if not self.is_leader:
                    wire.zero_()
                torch.ops.deepspeed.inference_all_reduce_(wire)  # the leader's total, shared with its host
        if wire is not tensor:
            tensor.copy_(wire)
        return tensor


if __name__ == "__main__":  # build the op ahead of a job (CI, an image), with the compiler's output shown
    ok, why = shm_status()
    if not ok:
        sys.exit(f"corecpu: {why}")
    load_op(verbose=True)
    print(f"corecpu: DeepSpeed's shared-memory op is built in {op_cache_dir()}")
