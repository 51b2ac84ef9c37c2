"""Which launcher started this process, and what rank it is.

One small class per launcher, each with `detect()` and `read()`, tried in a fixed
order: the launcher that sets the most specific variables wins. A Ray Train worker comes
first: Ray writes torchrun's variables into it (RANK, LOCAL_RANK, ...), so only its own
markers tell it apart. torchrun comes next (after a Kubeflow pod without torchrun, which
has RANK but no LOCAL_RANK) because it may run *under* Slurm or mpirun and then its RANK
is the one that counts. Nothing here touches torch, or imports ray.

Schedulers also say where rank 0 runs: Slurm's node list (SLURM_STEP_NODELIST /
SLURM_JOB_NODELIST, expanded by python-hostlist exactly as `scontrol show hostnames`
does) gives `LaunchInfo.master_addr`, and the job id a port every rank computes
alike; dist.master_address() uses them when MASTER_ADDR/MASTER_PORT are unset.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import ClassVar, Mapping

from corecpu import envvars
from corecpu.errors import CoreCPUError


@dataclass(frozen=True)
class LaunchInfo:
    launcher: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str | None = None  # rank 0's host, when the launcher's variables say (MASTER_ADDR wins)
    master_port: int | None = None  # a port every rank derives alike (MASTER_PORT wins)
    mpi: str = ""  # which MPI started the ranks, as `corecpu launch` found it ("Open MPI 4.1.4"); "" where unknown

    @property
    def label(self) -> str:
        """The launcher for people: "openmpi (Open MPI 4.1.4)"; hydra's name alone says Intel MPI or MPICH."""
        return f"{self.launcher} ({self.mpi})" if self.mpi else self.launcher

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise CoreCPUError(
                f"{self.launcher}: rank {self.rank} is outside world size {self.world_size}; "
                "check the launcher's rank variables"
            )
        if self.local_world_size < 1 or not 0 <= self.local_rank < self.local_world_size:
            raise CoreCPUError(
                f"{self.launcher}: local rank {self.local_rank} is outside local world size "
                f"{self.local_world_size}; check the launcher's local rank variables"
            )

    @property
    def node_rank(self) -> int:
        # Exact for the block placement every launcher here uses by default.
        return self.rank // self.local_world_size

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    # The launcher's facts, so no module compares launcher names as strings.
    @property
    def kind(self) -> type["Launcher"]:
        return _BY_NAME.get(self.launcher, Single)

    @property
    def launched(self) -> bool:
        """A launcher (not a person's shell) started this process."""
        return self.kind is not Single

    @property
    def mpi_world(self) -> bool:
        """The ranks are one MPI world (MPI_Init in each gives this rank and world size)."""
        return self.kind.mpi_world

    @property
    def cpus_per_task_per_rank(self) -> bool:
        """Slurm's SLURM_CPUS_PER_TASK describes this one rank (srun; mpirun inside an allocation)."""
        return self.kind.cpus_per_task_per_rank

    @property
    def slurm_task(self) -> bool:
        """srun started this process as a Slurm task (its --cpu-bind applies to it)."""
        return self.kind is Slurm


def _int(env: Mapping[str, str], name: str, launcher: str) -> int:
    value = env[name]
    try:
        return int(value)
    except ValueError:
        raise CoreCPUError(f"{launcher}: {name}={value!r} is not an integer; unset it or fix the launcher") from None


class Launcher:
    name: ClassVar[str]
    rank_var: ClassVar[str]
    size_var: ClassVar[str]
    local_rank_var: ClassVar[str | None]
    local_size_var: ClassVar[str | None]
    mpi_world: ClassVar[bool] = False  # an MPI launcher: mpi4py's COMM_WORLD is the job
    cpus_per_task_per_rank: ClassVar[bool] = False  # SLURM_CPUS_PER_TASK is one rank's budget

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return cls.rank_var in env and cls.size_var in env

    @classmethod
    def read(cls, env: Mapping[str, str]) -> LaunchInfo:
        rank = _int(env, cls.rank_var, cls.name)
        size = _int(env, cls.size_var, cls.name)
        has_local = cls.local_rank_var in env and cls.local_size_var in env
        if has_local:
            local_rank = _int(env, cls.local_rank_var, cls.name)  # type: ignore[arg-type]
            local_size = _int(env, cls.local_size_var, cls.name)  # type: ignore[arg-type]
        else:
            # Without local variables assume everything runs on this host; binding
            # then spreads ranks over the whole machine, which is safe.
            local_rank, local_size = rank, size
        return LaunchInfo(cls.name, rank, size, local_rank, local_size)


class TorchElastic(Launcher):
    """torchrun and anything else that speaks the torch.distributed env protocol.

    (ipexrun is not one of them: `ipexrun cpu --nnodes` starts ranks through Intel MPI's
    mpiexec.hydra, so they show up as intel-mpi with PMI_* variables.)
    """

    name = "torchrun"
    rank_var, size_var = "RANK", "WORLD_SIZE"
    local_rank_var, local_size_var = "LOCAL_RANK", "LOCAL_WORLD_SIZE"


class RayTrain(Launcher):
    """A Ray Train worker (TorchTrainer). Ray's torch backend exports torchrun's variables in every
    worker (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_*) and has already made
    the default process group (gloo on CPU) before the train function runs; setup() uses that group.
    RAY_RAYLET_PID marks any process a Ray node started; a torchrun started inside a Ray task sets
    TORCHELASTIC_RUN_ID in its children, which are then torchrun's ranks, not Ray's.
    """

    name = "ray"
    rank_var, size_var = "RANK", "WORLD_SIZE"
    local_rank_var, local_size_var = "LOCAL_RANK", "LOCAL_WORLD_SIZE"

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return "RAY_RAYLET_PID" in env and super().detect(env) and "TORCHELASTIC_RUN_ID" not in env

    @classmethod
    def read(cls, env: Mapping[str, str]) -> LaunchInfo:
        # Ray's own record wins over its copy in the environment, which anything in the worker may have edited.
        ranks = ray_train_ranks()
        return LaunchInfo(cls.name, *ranks) if ranks else super().read(env)


def ray_train_ranks() -> tuple[int, int, int, int] | None:
    """(rank, world size, local rank, local world size) from ray.train's context, in a Ray Train worker; else None.
    Only where ray.train is already loaded (it is in every Ray Train worker): corecpu never imports ray itself."""
    train = sys.modules.get("ray.train")
    if train is None:
        return None
    try:
        ctx = train.get_context()
        return (ctx.get_world_rank(), ctx.get_world_size(), ctx.get_local_rank(), ctx.get_local_world_size())
    except Exception:  # noqa: BLE001 - not inside a train function (a Ray task, the driver): no context
        return None


class OpenMPI(Launcher):
    name = "openmpi"
    mpi_world = True
    rank_var, size_var = "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"
    local_rank_var, local_size_var = "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"


class MVAPICH(Launcher):
    name = "mvapich"
    mpi_world = True
    rank_var, size_var = "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"
    local_rank_var, local_size_var = "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"


class IntelMPI(Launcher):
    """Intel MPI and MPICH hydra: PMI_* everywhere, MPI_LOCAL* from Intel MPI and MPICH >= 4."""

    name = "intel-mpi"
    mpi_world = True
    cpus_per_task_per_rank = True  # mpirun inside a Slurm allocation starts one rank per task
    rank_var, size_var = "PMI_RANK", "PMI_SIZE"
    local_rank_var, local_size_var = "MPI_LOCALRANKID", "MPI_LOCALNRANKS"


class Slurm(Launcher):
    """srun. SLURM_PROCID alone is set by sbatch too, so require the task count."""

    name = "slurm"
    cpus_per_task_per_rank = True
    rank_var, size_var = "SLURM_PROCID", "SLURM_NTASKS"
    local_rank_var, local_size_var = "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"

    @classmethod
    def read(cls, env: Mapping[str, str]) -> LaunchInfo:
        info = super().read(env)
        # SLURM_NTASKS_PER_NODE is only set with --ntasks-per-node (and then for the job,
        # not the step); SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE ("4(x2)" or "4,3")
        # give this node's count for the step srun started.
        spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
        if "SLURM_LOCALID" in env and spec and (cls.local_size_var not in env or "SLURM_STEP_TASKS_PER_NODE" in env):
            node_id = int(env.get("SLURM_NODEID", "0"))
            local_size = _slurm_tasks_on_node(spec, node_id)
            info = LaunchInfo(cls.name, info.rank, info.world_size, _int(env, "SLURM_LOCALID", cls.name), local_size)
        return with_slurm_hints(info, env)


def _slurm_tasks_on_node(spec: str, node_id: int) -> int:
    counts: list[int] = []
    for part in spec.split(","):
        count, _, rep = part.partition("(x")
        counts += [int(count)] * (int(rep.rstrip(")")) if rep else 1)
    return counts[min(node_id, len(counts) - 1)]


class KubeflowPyTorchJob(Launcher):
    """A PyTorchJob pod whose command is the training script itself, not torchrun.

    The training operator (kubeflow.org/v1) sets RANK = the pod's index (master 0,
    worker i -> i+1), WORLD_SIZE = replicas x nprocPerNode, MASTER_ADDR/PORT and
    PET_NNODES / PET_NODE_RANK / PET_NPROC_PER_NODE for torchrun, but no LOCAL_RANK.
    Read as torchrun, every rank would think all ranks share its pod. Under torchrun
    the children have LOCAL_RANK and are read as torchrun instead.
    """

    name = "kubeflow-pytorchjob"
    rank_var, size_var = "RANK", "WORLD_SIZE"
    local_rank_var, local_size_var = None, None

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return (super().detect(env) and "LOCAL_RANK" not in env
                and ("PET_NNODES" in env or "PET_NODE_RANK" in env))

    @classmethod
    def read(cls, env: Mapping[str, str]) -> LaunchInfo:
        nproc = env.get("PET_NPROC_PER_NODE", "1")
        if nproc.isdigit() and int(nproc) > 1:
            raise CoreCPUError(
                f"{cls.name}: nprocPerNode is {nproc} but this pod started one process without torchrun; "
                "start the container's command with torchrun (it reads the PET_* variables)"
            )
        rank, size = _int(env, "RANK", cls.name), _int(env, "WORLD_SIZE", cls.name)
        return LaunchInfo(cls.name, rank, size, 0, 1)


class KubeflowTrainJob(Launcher):
    """A Kubeflow Trainer v2 (TrainJob) pod whose command is the training script itself, not torchrun.

    The Trainer's torch runtime sets only torchrun's defaults (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
    PET_MASTER_ADDR/PORT), no RANK: without torchrun each pod would train alone, silently. One pod of one
    process is a plain single run; anything larger needs torchrun (examples/kubernetes/runtime-torch.yaml).
    """

    name = "kubeflow-trainjob"
    rank_var, size_var = "PET_NODE_RANK", "PET_NNODES"
    local_rank_var, local_size_var = None, None

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return "PET_NNODES" in env and "RANK" not in env and "LOCAL_RANK" not in env

    @classmethod
    def read(cls, env: Mapping[str, str]) -> LaunchInfo:
        nodes, nproc = env.get("PET_NNODES", "1"), env.get("PET_NPROC_PER_NODE", "1")
        if nodes != "1" or (nproc.isdigit() and int(nproc) > 1):
            raise CoreCPUError(f"{cls.name}: the TrainJob asks for {nodes} node(s) x {nproc} process(es) but this pod "
                               "started the script without torchrun, so it would train alone; start the container's "
                               "command with torchrun (it reads the PET_* variables), as runtime-torch.yaml does")
        return LaunchInfo(cls.name, 0, 1, 0, 1)


def slurm_master_addr(env: Mapping[str, str]) -> str | None:
    """First host of the step's (else the job's) node list: where srun and mpirun put rank 0."""
    names = [var for var in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST") if env.get(var, "").strip()]
    if not names:
        return None
    try:
        import hostlist  # python-hostlist: Slurm's own bracket syntax, node[01-04,07]
    except ImportError:  # a declared dependency, but a preinstalled environment run from a checkout may lack it
        raise CoreCPUError(f"{names[0]} needs python-hostlist to read, and it is not installed; pip install "
                           "python-hostlist, or export MASTER_ADDR (rank 0's host)") from None
    var, text = names[0], env[names[0]].strip()
    try:
        hosts = hostlist.expand_hostlist(text)
    except hostlist.BadHostlist as exc:
        raise CoreCPUError(f"{var}={text!r} is not a Slurm node list ({exc}); export MASTER_ADDR instead") from None
    return hosts[0] if hosts else None


SLURM_PORT_BASE, SLURM_PORT_SPAN = 10000, 20000  # 10000-29999: below Linux's ephemeral range


def slurm_master_port(env: Mapping[str, str]) -> int | None:
    """A port from the job id, so every rank of the job picks the same one without talking."""
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job or not job.isdigit():
        return None
    return SLURM_PORT_BASE + int(job) % SLURM_PORT_SPAN


def with_slurm_hints(info: LaunchInfo, env: Mapping[str, str]) -> LaunchInfo:
    if info.master_addr is not None or not info.distributed:
        return info
    addr = slurm_master_addr(env)
    return replace(info, master_addr=addr, master_port=slurm_master_port(env)) if addr else info


class Single(Launcher):
    """No launcher: `python train.py`, one process of one."""

    name = "single"

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return True

    @classmethod
    def read(cls, env: Mapping[str, str]) -> LaunchInfo:
        return LaunchInfo(cls.name, 0, 1, 0, 1)


LAUNCHERS: tuple[type[Launcher], ...] = (RayTrain, KubeflowPyTorchJob, KubeflowTrainJob, TorchElastic, OpenMPI, MVAPICH,
                                         IntelMPI, Slurm)
_BY_NAME = {cls.name: cls for cls in (*LAUNCHERS, Single)}


def detect_launcher(env: Mapping[str, str]) -> LaunchInfo:
    """Rank layout from the environment; a plain `python train.py` is one process of one."""
    for launcher in LAUNCHERS:
        if launcher.detect(env):
            info = launcher.read(env)
            if launcher.mpi_world and env.get(envvars.MPI):
                info = replace(info, mpi=env[envvars.MPI])  # what corecpu launch found its mpirun to be
            # mpirun inside a Slurm allocation places rank 0 on the allocation's first node too.
            return with_slurm_hints(info, env) if launcher is IntelMPI else info
    return Single.read(env)
