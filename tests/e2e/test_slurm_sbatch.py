"""Tier 3: examples/slurm/train.sbatch run end to end through a fake srun (tests/helpers/fake_srun.py):
two tasks on one node, and two "nodes" in network namespaces, with srun and with Intel MPI's mpirun
(rank layout and the rest from SLURM_* variables: tests/unit/cluster/test_slurm.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.common import ROOT
from helpers.netns import two_hosts

SBATCH = ROOT / "examples/slurm/train.sbatch"
FAKE_SRUN = ROOT / "tests/helpers/fake_srun.py"


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


@pytest.mark.parametrize("launcher, seen_as", [("srun", "slurm"), ("mpirun", "intel-mpi")])
def test_sbatch_two_tasks_on_one_node(tmp_path, launcher, seen_as):
    out = tmp_path / "run"
    # mpirun inside a one-node allocation starts its ranks here without calling srun
    env = sbatch_env(tmp_path, [os.uname().nodename], 2, {"CORECPU_LAUNCHER": launcher})
    r = subprocess.run(["bash", str(SBATCH), *train_args(out)], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=600, stdin=subprocess.DEVNULL)
    topo = check_run(r, out, 2, seen_as)
    assert all(t["torch_threads"] == 1 for t in topo), topo  # --cpus-per-task=1


@pytest.mark.parametrize("launcher, seen_as", [("srun", "slurm"), ("mpirun", "intel-mpi")])
def test_sbatch_two_nodes_in_network_namespaces(tmp_path, launcher, seen_as):
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
