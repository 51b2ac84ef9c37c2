"""Slurm: rank layout, rank-0 host and port from SLURM_* variables, threads per task, srun's binding
(examples/slurm/train.sbatch run through a fake srun: tests/e2e/test_slurm_sbatch.py)."""

from __future__ import annotations

import sys

import os

import pytest

from corecpu.launching.bind import srun_bound
from corecpu.distributed.process_group import master_address
from corecpu.errors import CoreCPUError
from corecpu.cluster.launchers import LaunchInfo, detect_launcher, slurm_master_addr, slurm_master_port
from corecpu.cpu.threads import decide_threads, thread_budget


def srun_task_env(procid: int, nodeid: int, localid: int, **extra: str) -> dict[str, str]:
    """What srun puts in a task's environment: 2 nodes x 2 tasks, job 4242, step 0."""
    env = {
        "SLURM_JOB_ID": "4242", "SLURM_JOBID": "4242", "SLURM_STEP_ID": "0",
        "SLURM_JOB_NODELIST": "node[07-08]", "SLURM_STEP_NODELIST": "node[07-08]", "SLURM_NODELIST": "node[07-08]",
        "SLURM_NNODES": "2", "SLURM_NTASKS": "4", "SLURM_NPROCS": "4",
        "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_PROCID": str(procid), "SLURM_NODEID": str(nodeid), "SLURM_LOCALID": str(localid),
        "SLURM_CPUS_PER_TASK": "28", "SLURMD_NODENAME": f"node0{7 + nodeid}",
    }
    env.update(extra)
    return env


# ---------------------------------------------------------------- node lists (python-hostlist)


@pytest.mark.parametrize("nodelist, first", [
    ("node[01-04,07]", "node01"),
    ("node07", "node07"),
    ("cn[100-102],gpu[1-2]", "cn100"),
    ("rack1-[3-4]n[01-02]", "rack1-3n01"),   # two bracket groups, as scontrol expands them
    ("a,b,c", "a"),
])
def test_first_host_of_nodelist(nodelist, first):
    assert slurm_master_addr({"SLURM_JOB_NODELIST": nodelist}) == first


def test_step_nodelist_wins_over_job_nodelist():
    # srun -w node08 inside a 2-node job: rank 0 runs on the step's first node.
    env = {"SLURM_JOB_NODELIST": "node[07-08]", "SLURM_STEP_NODELIST": "node08"}
    assert slurm_master_addr(env) == "node08"


def test_without_python_hostlist_only_a_node_list_to_read_needs_it(monkeypatch):
    # A preinstalled environment run from a checkout (the air-gapped node of issue 29) may lack it.
    monkeypatch.setitem(sys.modules, "hostlist", None)  # import hostlist now raises ImportError
    assert slurm_master_addr({}) is None
    with pytest.raises(CoreCPUError) as err:
        slurm_master_addr({"SLURM_JOB_NODELIST": "node[07-08]"})
    assert str(err.value) == ("SLURM_JOB_NODELIST needs python-hostlist to read, and it is not installed; pip install "
                              "python-hostlist, or export MASTER_ADDR (rank 0's host)")


def test_bad_nodelist_is_a_one_line_error():
    with pytest.raises(CoreCPUError) as err:
        slurm_master_addr({"SLURM_JOB_NODELIST": "node[03-01"})
    assert "SLURM_JOB_NODELIST='node[03-01'" in str(err.value) and "\n" not in str(err.value)


def test_port_is_a_function_of_the_job_id():
    a, b = slurm_master_port({"SLURM_JOB_ID": "4242"}), slurm_master_port({"SLURM_JOB_ID": "4243"})
    assert a == slurm_master_port({"SLURM_JOBID": "4242"})  # every rank computes the same port
    assert a != b and all(10000 <= p < 30000 for p in (a, b))
    assert slurm_master_port({}) is None and slurm_master_port({"SLURM_JOB_ID": "x"}) is None


# ---------------------------------------------------------------- srun tasks


def test_srun_task_layout_and_hints():
    info = detect_launcher(srun_task_env(3, 1, 1))
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) == ("slurm", 3, 4, 1, 2)
    assert info.node_rank == 1
    assert info.master_addr == "node07" and info.master_port == slurm_master_port({"SLURM_JOB_ID": "4242"})


def test_step_tasks_per_node_beats_job_ntasks_per_node():
    # `srun -n 2 --ntasks-per-node 1` inside a --ntasks-per-node=2 job: one task per node in this step.
    env = srun_task_env(1, 1, 0, SLURM_NTASKS="2", SLURM_STEP_TASKS_PER_NODE="1(x2)")
    assert detect_launcher(env).local_world_size == 1


def test_master_address_prefers_environment_then_slurm_hint():
    env = srun_task_env(0, 0, 0)
    info = detect_launcher(env)
    assert master_address(env, info) == ("node07", 10000 + 4242)
    assert master_address({**env, "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "1234"}, info) == ("10.0.0.9", 1234)


def test_mpirun_inside_allocation_gets_the_hint():
    env = {"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2",
           "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "c[3-4]", "SLURM_CPUS_PER_TASK": "8"}
    info = detect_launcher(env)
    assert (info.launcher, info.master_addr, info.master_port) == ("intel-mpi", "c3", 10077)


def test_torchrun_under_srun_keeps_torchrun_layout():
    env = srun_task_env(0, 0, 0, RANK="5", WORLD_SIZE="8", LOCAL_RANK="1", LOCAL_WORLD_SIZE="4",
                        MASTER_ADDR="node07", MASTER_PORT="29400")
    info = detect_launcher(env)
    assert (info.launcher, info.rank, info.master_addr) == ("torchrun", 5, None)


# ---------------------------------------------------------------- threads and binding


def test_cpus_per_task_is_the_thread_budget():
    env = srun_task_env(0, 0, 0, SLURM_CPUS_PER_TASK="4")
    info = detect_launcher(env)
    budget = thread_budget(env, info, None)
    assert budget == (4, "SLURM_CPUS_PER_TASK=4")
    unbound = frozenset(range(16))
    # whole node visible (no cgroup cpuset), 2 local ranks: 8 each would oversubscribe the task's CPUs
    d = decide_threads(0, env, unbound, unbound, info, None, budget)
    assert d.threads == 4 and "SLURM_CPUS_PER_TASK=4" in d.reason
    assert decide_threads(0, env, unbound, unbound, info, None).threads == 8  # the same without the budget
    assert decide_threads(6, env, unbound, unbound, info, None, budget).threads == 6  # --threads wins


def test_smaller_of_cpus_per_task_and_quota_share():
    env = srun_task_env(0, 0, 0, SLURM_CPUS_PER_TASK="8")
    info = detect_launcher(env)
    assert thread_budget(env, info, 6)[0] == 3  # quota of 6 CPUs shared by 2 local ranks
    assert thread_budget({}, LaunchInfo("torchrun", 0, 2, 0, 2), None) == (None, "")


@pytest.mark.parametrize("bind_type, bound", [("mask_cpu:", True), ("cores", True), ("none", False), ("", False)])
def test_srun_binding_is_respected_only_when_srun_bound(bind_type, bound):
    env = {"SLURM_CPU_BIND_TYPE": bind_type} if bind_type else {}
    assert srun_bound(LaunchInfo("slurm", 0, 2, 0, 2), env) is bound
    assert srun_bound(LaunchInfo("intel-mpi", 0, 2, 0, 2), {"SLURM_CPU_BIND_TYPE": "mask_cpu:"}) is False


def test_bind_keeps_the_cpus_srun_gave_the_task():
    from corecpu import envvars
    from corecpu.launching.bind import prepare
    from corecpu.cpu.cpulist import format_cpu_list

    mine = tuple(sorted(os.sched_getaffinity(0)))  # stands for the mask srun --cpu-bind gave this task
    env = {**srun_task_env(1, 0, 1, SLURM_NTASKS="2", SLURM_STEP_TASKS_PER_NODE="2", SLURM_STEP_NODELIST="node07"),
           "SLURM_CPU_BIND_TYPE": "mask_cpu:", "PATH": os.environ.get("PATH", ""),
           envvars.BACKEND: "gloo"}  # auto would reserve a oneCCL worker core wherever the bindings are built
    cmd, out_env, cpus, _ = prepare(["--no-membind", "--", "true"], env)
    assert cmd == ["true"] and cpus == mine and out_env[envvars.BOUND_CPUS] == format_cpu_list(mine)
    assert int(out_env["OMP_NUM_THREADS"]) <= len(mine)
