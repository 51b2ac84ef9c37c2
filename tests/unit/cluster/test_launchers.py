"""Tier 1: rank layout from each launcher's environment variables."""

import pytest

from corecpu.errors import CoreCPUError
from corecpu.cluster.launchers import detect_launcher

CASES = {
    "intel-mpi": {"PMI_RANK": "3", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
    "openmpi": {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
    "mvapich": {"MV2_COMM_WORLD_RANK": "3", "MV2_COMM_WORLD_SIZE": "8",
                "MV2_COMM_WORLD_LOCAL_RANK": "1", "MV2_COMM_WORLD_LOCAL_SIZE": "2"},
    "slurm": {"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2"},
    "torchrun": {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_launcher(name):
    info = detect_launcher(CASES[name])
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) == (name, 3, 8, 1, 2)
    assert info.node_rank == 1 and info.distributed


def test_no_variables_is_one_process():
    info = detect_launcher({})
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) == ("single", 0, 1, 0, 1)
    assert not info.distributed


def test_torchrun_under_slurm_wins():
    # torchrun started by srun: torchrun's RANK describes this process, SLURM_PROCID the agent.
    env = {**CASES["slurm"], "RANK": "5", "WORLD_SIZE": "16", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"}
    info = detect_launcher(env)
    assert (info.launcher, info.rank, info.world_size) == ("torchrun", 5, 16)


def test_slurm_tasks_per_node_spec():
    env = {"SLURM_PROCID": "6", "SLURM_NTASKS": "7", "SLURM_LOCALID": "2", "SLURM_NODEID": "1",
           "SLURM_TASKS_PER_NODE": "4,3"}
    info = detect_launcher(env)
    assert (info.local_rank, info.local_world_size) == (2, 3)
    env["SLURM_TASKS_PER_NODE"] = "2(x3),1"
    env.update(SLURM_NODEID="3", SLURM_LOCALID="0", SLURM_PROCID="6")
    assert detect_launcher(env).local_world_size == 1


def test_missing_local_variables_assume_one_host():
    info = detect_launcher({"PMI_RANK": "1", "PMI_SIZE": "2"})
    assert (info.local_rank, info.local_world_size) == (1, 2)


@pytest.mark.parametrize("env, fragment", [
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "rank 2 is outside world size 2"),
    ({"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "3", "MPI_LOCALNRANKS": "2"}, "local rank 3"),
])
def test_bad_values_are_one_line_errors(env, fragment):
    with pytest.raises(CoreCPUError) as err:
        detect_launcher(env)
    assert fragment in str(err.value) and "\n" not in str(err.value)
