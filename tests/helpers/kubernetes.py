"""The example Kubernetes manifests (examples/kubernetes/), what the Kubeflow training operator puts in a
PyTorchJob pod's environment (sources: tests/unit/cluster/test_kubernetes.py), mutations for the CRD
tests, the Dockerfile's user, and launcher scripts run with stand-ins for mpirun and getent."""

from __future__ import annotations

import re
from pathlib import Path

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


def rename_key(obj: dict, path: list, wrong: str) -> None:
    """A mutation: rename the key at `path` (a list of keys and indices) to `wrong`."""
    *parents, key = path
    for p in parents:
        obj = obj[p]
    obj[wrong] = obj.pop(key)


def dockerfile() -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def image_user() -> str:
    """The Dockerfile's last USER, which must be numeric: a name cannot be checked by runAsNonRoot."""
    users = [line.split()[1].split(":")[0] for line in dockerfile() if line.upper().startswith("USER ")]
    assert users and users[-1].isdigit(), f"USER must be a numeric UID for runAsNonRoot, got {users}"
    return users[-1]


def run_with_stubs(tmp_path: Path, argv: list[str], env: dict[str, str], getent: str = "exit 0"):
    """A launcher's `bash -c SCRIPT ...` command with stand-ins for mpirun (prints what it got, then the
    hostfile it was given), getent (logs each lookup to tmp_path/getent.log, then runs `getent`) and sleep."""
    import shutil
    import subprocess

    import pytest

    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash not found")
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    stubs = {"mpirun": 'echo "MASTER_ADDR=$MASTER_ADDR I_MPI_PIN=$I_MPI_PIN ARGS=$*"\n'
                       'echo "HOSTS=$(tr "\\n" " " < "$I_MPI_HYDRA_HOST_FILE")"',
             "getent": f'echo "$*" >> {tmp_path}/getent.log; {getent}', "sleep": "exit 0"}
    for name, body in stubs.items():
        (bindir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bindir / name).chmod(0o755)
    assert argv[0] == "bash"
    return subprocess.run([bash, *argv[1:]], env={**env, "PATH": f"{bindir}:/usr/bin:/bin", "TMPDIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=30)
