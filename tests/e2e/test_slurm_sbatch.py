"""Tier 3: examples/slurm/train.sbatch run end to end through a fake srun (tests/helpers/fake_srun.py):
two tasks on one node, and two "nodes" in network namespaces, with srun and with Intel MPI's mpirun
(rank layout and the rest from SLURM_* variables: tests/unit/cluster/test_slurm.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from helpers.common import ROOT
from helpers.netns import two_hosts
from helpers.slurm import SBATCH, sbatch_env, scontrol_calls


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
    assert scontrol_calls(tmp_path) == []  # a job that ended normally is not requeued


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
