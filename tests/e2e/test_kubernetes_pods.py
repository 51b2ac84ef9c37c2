"""Tier 3: the example PyTorchJob's command, run as written in a master and a worker "pod" (two network
namespaces) with the training operator's variables (the manifests themselves: tests/unit/cluster/test_kubernetes.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from helpers.common import ROOT
from helpers.kubernetes import expand_k8s, load, pytorchjob_pod_env
from helpers.netns import two_hosts

pytest.importorskip("yaml")


def test_pytorchjob_command_trains_across_two_pods(tmp_path):
    """Master and worker pod, each its own network namespace, run the manifest's exact command
    with the operator's variables (1 rank per pod here, to stay small)."""
    import json
    import os
    import sys

    job = load("pytorchjob.yaml")
    out = tmp_path / "runs"
    with two_hosts() as h:
        procs = []
        for rank, role in enumerate(("Master", "Worker")):
            c = job["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]["containers"][0]
            env = {**pytorchjob_pod_env(rank, replicas=2, nproc="1"), "MASTER_ADDR": h.addresses[0],
                   "MASTER_PORT": str(c["ports"][0]["containerPort"])}
            argv = [expand_k8s(a, env) for a in c["command"] + c.get("args", [])]
            argv = [str(ROOT / "train.py") if a == "/opt/corecpu/train.py" else a for a in argv]
            argv = [f"--output-dir={out}" if a.startswith("--output-dir=") else a for a in argv]
            argv += ["--precision", "fp32", "--max-steps", "4", "--log-every", "2", "--progress", "off"]
            argv[0] = str(Path(sys.executable).parent / "torchrun")
            full = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PMI_", "MASTER_"))}
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
