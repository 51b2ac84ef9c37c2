"""Tier 3: the example PyTorchJob's command and the Trainer v2 TrainJob's pod command, each run as written in two
"pods" (two network namespaces) with the variables the operator gives them (the manifests themselves:
tests/unit/cluster/test_kubernetes.py and test_kubernetes_trainer.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.common import ROOT
from helpers.kubernetes import expand_k8s, load, pytorchjob_pod_env
from helpers.netns import two_hosts

pytest.importorskip("yaml")


def pytorchjob_pods(master: str) -> list[tuple[list[str], dict[str, str]]]:
    """(command, environment) of the master and the worker pod, 1 rank per pod."""
    job = load("pytorchjob.yaml")
    pods = []
    for rank, role in enumerate(("Master", "Worker")):
        c = job["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]["containers"][0]
        env = {**pytorchjob_pod_env(rank, replicas=2, nproc="1"), "MASTER_ADDR": master,
               "MASTER_PORT": str(c["ports"][0]["containerPort"])}
        pods.append(([expand_k8s(a, env) for a in c["command"] + c.get("args", [])], env))
    return pods


def trainjob_pods(master: str) -> list[tuple[list[str], dict[str, str]]]:
    """The "node" pods of trainjob.yaml on runtime-torch.yaml: the runtime's command, the job's args and the
    Trainer torch plugin's PET_* variables (PET_MASTER_ADDR is <job>-node-0-0.<job> there, an address here)."""
    runtime, job = load("runtime-torch.yaml"), load("trainjob.yaml")
    c = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    argv = c["command"] + job["spec"]["trainer"]["args"]
    base = {"PYTHONUNBUFFERED": "1", "PET_NNODES": "2", "PET_NPROC_PER_NODE": "1",
            "PET_MASTER_ADDR": master, "PET_MASTER_PORT": "29500"}
    return [(argv, {**base, "PET_NODE_RANK": str(i), "HOSTNAME": f"corecpu-train-node-0-{i}"}) for i in range(2)]


@pytest.mark.parametrize("pods", [pytorchjob_pods, trainjob_pods], ids=["pytorchjob", "trainjob"])
def test_pod_command_trains_across_two_pods(tmp_path, pods):
    """Each pod in its own network namespace runs the manifest's exact command with the operator's
    variables (1 rank per pod here, to stay small)."""
    out = tmp_path / "runs"
    with two_hosts() as h:
        procs = []
        for rank, (argv, env) in enumerate(pods(h.addresses[0])):
            argv = [str(ROOT / "train.py") if a == "/opt/corecpu/train.py" else a for a in argv]
            argv = [f"--output-dir={out}" if a.startswith("--output-dir=") else a for a in argv]
            argv += ["--precision", "fp32", "--max-steps", "4", "--log-every", "2", "--progress", "off"]
            argv[0] = str(Path(sys.executable).parent / "torchrun")
            full = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PMI_", "MASTER_", "PET_"))}
            full.update(env, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}", PYTHONPATH=str(ROOT))
            full.pop("GLOO_SOCKET_IFNAME", None)
            procs.append(subprocess.Popen(h.cmd_in(h.namespaces[rank], argv), env=full, cwd=ROOT, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        logs = []
        for p in procs:
            try:
                logs.append(p.communicate(timeout=600)[0])
            except subprocess.TimeoutExpired:
                p.kill()
                logs.append(p.communicate()[0])
    log = "\n".join(f"--- pod {i} rc={p.returncode}\n{text[-3000:]}" for i, (p, text) in enumerate(zip(procs, logs)))
    assert all(p.returncode == 0 for p in procs), log
    assert "2 rank(s) via torchrun" in logs[0], log
    summary = json.loads((out / "summary.json").read_text())
    assert len({r["param_checksum"] for r in summary["ranks"]}) == 1, log
    topo = json.loads((out / "topology.json").read_text())["ranks"]
    assert [t["host"] for t in topo] == list(h.hostnames), topo
