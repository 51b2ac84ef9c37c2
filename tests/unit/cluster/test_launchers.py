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


# What Ray Train's torch backend exports in a TorchTrainer worker (ray/train/torch/config.py, Ray 2.60), beside
# RAY_RAYLET_PID, which every process a Ray node starts has.
RAY_WORKER = {"RAY_RAYLET_PID": "4242", "RAY_JOB_ID": "01000000", "OMP_NUM_THREADS": "1", "MASTER_ADDR": "10.0.0.2",
              "MASTER_PORT": "42703", "RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
              "NODE_RANK": "1", "ACCELERATE_TORCH_DEVICE": "cpu"}


def test_a_ray_train_worker_is_ray_not_torchrun():
    # Ray writes torchrun's variables: without its own class the worker would pass for a torchrun rank.
    info = detect_launcher(RAY_WORKER)
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) == ("ray", 3, 8, 1, 2)
    assert info.node_rank == 1 and info.launched and not info.mpi_world
    without_ray = {k: v for k, v in RAY_WORKER.items() if not k.startswith("RAY_")}
    assert detect_launcher(without_ray).launcher == "torchrun"


def test_torchrun_inside_a_ray_task_is_torchrun():
    # A Ray task that runs torchrun: its children inherit RAY_RAYLET_PID, but torchrun's variables describe them.
    env = {**RAY_WORKER, "TORCHELASTIC_RUN_ID": "abc", "RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}
    assert detect_launcher(env).launcher == "torchrun"


def test_a_ray_task_that_is_no_train_worker_is_one_process():
    assert detect_launcher({"RAY_RAYLET_PID": "4242", "OMP_NUM_THREADS": "1"}).launcher == "single"


def test_ray_trains_own_context_wins_over_its_copy_in_the_environment(monkeypatch):
    import sys
    import types

    class Context:  # ray.train.get_context() in a worker: world rank, size, local rank, local size
        def get_world_rank(self): return 5
        def get_world_size(self): return 8
        def get_local_rank(self): return 1
        def get_local_world_size(self): return 4

    monkeypatch.setitem(sys.modules, "ray.train", types.SimpleNamespace(get_context=Context))
    info = detect_launcher(RAY_WORKER)
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) == ("ray", 5, 8, 1, 4)

    def outside_a_worker():
        raise RuntimeError("TrainContext has not been initialized.")

    monkeypatch.setitem(sys.modules, "ray.train", types.SimpleNamespace(get_context=outside_a_worker))
    assert detect_launcher(RAY_WORKER).rank == 3  # no context: the environment Ray wrote
