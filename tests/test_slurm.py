"""Slurm: rank layout, rank-0 host and port from SLURM_* variables, threads per task, and
examples/slurm/train.sbatch run end to end through a fake srun (tests/fake_srun.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from corecpu.launching.bind import srun_bound
from corecpu.distributed.process_group import master_address
from corecpu.errors import CoreCPUError
from corecpu.cluster.launchers import LaunchInfo, detect_launcher, slurm_master_addr, slurm_master_port
from corecpu.cpu.threads import decide_threads, thread_budget

ROOT = Path(__file__).resolve().parents[1]
SBATCH = ROOT / "examples/slurm/train.sbatch"
FAKE_SRUN = Path(__file__).resolve().parent / "fake_srun.py"


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


# ---------------------------------------------------------------- the sbatch script through a fake srun


def sbatch_env(tmp_path: Path, nodes: list[str], tasks_per_node: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The batch step's environment as sbatch gives it, plus the fake srun first on PATH."""
    import hostlist

    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    (shim / "srun").symlink_to(FAKE_SRUN)
    FAKE_SRUN.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_", "PMI_", "RANK", "WORLD_SIZE"))}
    env.update({
        "PATH": os.pathsep.join([str(shim), str(Path(sys.executable).parent), env.get("PATH", "")]),
        "SLURM_JOB_ID": "31337", "SLURM_JOBID": "31337", "SLURM_JOB_NAME": "corecpu",
        "SLURM_JOB_NODELIST": hostlist.collect_hostlist(nodes), "SLURM_NODELIST": hostlist.collect_hostlist(nodes),
        "SLURM_JOB_NUM_NODES": str(len(nodes)), "SLURM_NNODES": str(len(nodes)),
        "SLURM_NTASKS": str(len(nodes) * tasks_per_node), "SLURM_NPROCS": str(len(nodes) * tasks_per_node),
        "SLURM_NTASKS_PER_NODE": str(tasks_per_node), "SLURM_TASKS_PER_NODE": f"{tasks_per_node}(x{len(nodes)})",
        "SLURM_CPUS_PER_TASK": "1", "SLURM_SUBMIT_DIR": str(ROOT), "SLURM_PROCID": "0", "SLURM_NODEID": "0",
        "SLURMD_NODENAME": nodes[0], "PYTHONPATH": str(ROOT),
    })
    env.update(extra or {})
    return env


def train_args(out: Path) -> list[str]:
    return ["--model", "tiny", "--precision", "fp32", "--max-steps", "4", "--log-every", "2", "--progress", "off",
            "--output-dir", str(out)]


def check_run(r: subprocess.CompletedProcess, out: Path, ranks: int, launcher: str = "slurm") -> list[dict]:
    log = f"rc={r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"
    assert r.returncode == 0, log
    assert f"{ranks} rank(s) via {launcher}" in r.stdout, log
    summary = json.loads((out / "summary.json").read_text())
    assert [v["rank"] for v in summary["ranks"]] == list(range(ranks)), log
    assert len({v["param_checksum"] for v in summary["ranks"]}) == 1, log
    topo = json.loads((out / "topology.json").read_text())["ranks"]
    assert all(t["binding"].startswith("bound by corecpu.bind") for t in topo), topo
    return topo


@pytest.mark.e2e
@pytest.mark.parametrize("launcher, seen_as", [("srun", "slurm"), ("mpirun", "intel-mpi")])
def test_sbatch_two_tasks_on_one_node(tmp_path, launcher, seen_as):
    out = tmp_path / "run"
    # mpirun inside a one-node allocation starts its ranks here without calling srun
    env = sbatch_env(tmp_path, [os.uname().nodename], 2, {"CORECPU_LAUNCHER": launcher})
    r = subprocess.run(["bash", str(SBATCH), *train_args(out)], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=600, stdin=subprocess.DEVNULL)
    topo = check_run(r, out, 2, seen_as)
    assert "MASTER_ADDR" not in env and "MASTER_PORT" not in env  # SLURM_JOB_NODELIST / SLURM_JOB_ID gave them
    assert all(t["torch_threads"] == 1 for t in topo), topo  # --cpus-per-task=1


@pytest.mark.e2e
@pytest.mark.parametrize("launcher, seen_as", [("srun", "slurm"), ("mpirun", "intel-mpi")])
def test_sbatch_two_nodes_in_network_namespaces(tmp_path, launcher, seen_as):
    try:
        from .netns import two_hosts
    except ImportError:
        from netns import two_hosts

    out = tmp_path / "run"
    with two_hosts() as h:
        nodes = list(h.hostnames)  # cc-node0, cc-node1: resolvable inside the namespaces only
        env = sbatch_env(tmp_path, nodes, 1, {
            "CORECPU_LAUNCHER": launcher,
            # the fake srun runs node i's tasks through this script (like slurmd on that node);
            # mpirun's hydra starts its proxy on each node through that srun
            "FAKE_SRUN_NODE_EXEC": str(h.bootstrap_exec),
            "I_MPI_HYDRA_IFACE": h.iface,
        })
        env.pop("GLOO_SOCKET_IFNAME", None)
        r = subprocess.run(h.cmd_in(h.namespaces[0], ["bash", str(SBATCH), *train_args(out)]), env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    topo = check_run(r, out, 2, seen_as)
    assert [t["host"] for t in topo] == nodes, topo
    # no MASTER_ADDR anywhere: rank 0's host came from SLURM_JOB_NODELIST, and gloo found the veth to it
    assert [t["gloo_socket_ifname"] for t in topo] == [h.iface, h.iface], topo


def test_bind_keeps_the_cpus_srun_gave_the_task():
    from corecpu import envvars
    from corecpu.launching.bind import prepare
    from corecpu.cpu.cpulist import format_cpu_list

    mine = tuple(sorted(os.sched_getaffinity(0)))  # stands for the mask srun --cpu-bind gave this task
    env = {**srun_task_env(1, 0, 1, SLURM_NTASKS="2", SLURM_STEP_TASKS_PER_NODE="2", SLURM_STEP_NODELIST="node07"),
           "SLURM_CPU_BIND_TYPE": "mask_cpu:", "PATH": os.environ.get("PATH", "")}
    cmd, out_env, cpus, _ = prepare(["--no-membind", "--", "true"], env)
    assert cmd == ["true"] and cpus == mine and out_env[envvars.BOUND_CPUS] == format_cpu_list(mine)
    assert int(out_env["OMP_NUM_THREADS"]) <= len(mine)
