"""The example Kubernetes manifests (examples/kubernetes/) and what the Kubeflow training operator
puts in a PyTorchJob pod's environment; see tests/unit/cluster/test_kubernetes.py for the sources."""

from __future__ import annotations

import re

from helpers.common import ROOT

K8S = ROOT / "examples/kubernetes"

POD = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443", "HOSTNAME": "corecpu-train-worker-0"}


def pytorchjob_pod_env(rank: int, replicas: int = 2, nproc: str = "1") -> dict[str, str]:
    nproc_int = int(nproc) if nproc.isdigit() else 1
    return {**POD, "PYTHONUNBUFFERED": "1", "MASTER_PORT": "23456", "MASTER_ADDR": "corecpu-train-master-0",
            "WORLD_SIZE": str(replicas * nproc_int), "RANK": str(rank), "PET_NPROC_PER_NODE": nproc,
            "PET_NODE_RANK": str(rank), "PET_NNODES": str(replicas)}


def load(name: str) -> dict:
    import yaml  # the test extra (pyyaml); the tests that call this skip without it

    docs = list(yaml.safe_load_all((K8S / name).read_text()))
    assert len(docs) == 1, f"{name}: one object per file"
    return docs[0]


def expand_k8s(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command/args: defined variables only."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), arg)
