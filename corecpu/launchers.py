"""Which launcher started this process, and what rank it is.

One small class per launcher, each with `detect()` and `read()`, tried in a fixed
order: the launcher that sets the most specific variables wins. torchrun comes first because they may run *under* Slurm or mpirun and then their RANK is
the one that counts. Nothing here touches torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

from corecpu.errors import CoreCPUError


@dataclass(frozen=True)
class LaunchInfo:
    launcher: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

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


class OpenMPI(Launcher):
    name = "openmpi"
    rank_var, size_var = "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"
    local_rank_var, local_size_var = "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"


class MVAPICH(Launcher):
    name = "mvapich"
    rank_var, size_var = "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"
    local_rank_var, local_size_var = "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"


class IntelMPI(Launcher):
    """Intel MPI and MPICH hydra: PMI_* everywhere, MPI_LOCAL* from Intel MPI and MPICH >= 4."""

    name = "intel-mpi"
    rank_var, size_var = "PMI_RANK", "PMI_SIZE"
    local_rank_var, local_size_var = "MPI_LOCALRANKID", "MPI_LOCALNRANKS"


class Slurm(Launcher):
    """srun. SLURM_PROCID alone is set by sbatch too, so require the task count."""

    name = "slurm"
    rank_var, size_var = "SLURM_PROCID", "SLURM_NTASKS"
    local_rank_var, local_size_var = "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"

    @classmethod
    def read(cls, env: Mapping[str, str]) -> LaunchInfo:
        info = super().read(env)
        # SLURM_NTASKS_PER_NODE is only set with --ntasks-per-node; SLURM_TASKS_PER_NODE
        # ("4(x2)" or "4,3") is always there and gives this node's count.
        if cls.local_size_var not in env and "SLURM_LOCALID" in env and "SLURM_TASKS_PER_NODE" in env:
            node_id = int(env.get("SLURM_NODEID", "0"))
            local_size = _slurm_tasks_on_node(env["SLURM_TASKS_PER_NODE"], node_id)
            return LaunchInfo(cls.name, info.rank, info.world_size, _int(env, "SLURM_LOCALID", cls.name), local_size)
        return info


def _slurm_tasks_on_node(spec: str, node_id: int) -> int:
    counts: list[int] = []
    for part in spec.split(","):
        count, _, rep = part.partition("(x")
        counts += [int(count)] * (int(rep.rstrip(")")) if rep else 1)
    return counts[min(node_id, len(counts) - 1)]


LAUNCHERS: tuple[type[Launcher], ...] = (TorchElastic, OpenMPI, MVAPICH, IntelMPI, Slurm)


def detect_launcher(env: Mapping[str, str]) -> LaunchInfo:
    """Rank layout from the environment; a plain `python train.py` is one process of one."""
    for launcher in LAUNCHERS:
        if launcher.detect(env):
            return launcher.read(env)
    return LaunchInfo("single", 0, 1, 0, 1)
