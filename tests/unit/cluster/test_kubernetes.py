"""Kubernetes: the example manifests against the CRD fields they use, the Dockerfile's
rules, and launcher detection with exactly the variables each operator sets (the PyTorchJob's
command run across two namespace "pods": tests/e2e/test_kubernetes_pods.py).

Variables, from the operators' sources:
- Kubeflow training-operator, PyTorchJob kubeflow.org/v1 (pkg/controller.v1/pytorch/envvar.go,
  master.go): PYTHONUNBUFFERED=0, MASTER_ADDR=<job>-master-0, MASTER_PORT=<pytorchjob-port>,
  WORLD_SIZE=replicas x nprocPerNode, RANK=<pod index> (master 0, worker i -> i+1),
  PET_NPROC_PER_NODE, PET_NODE_RANK, PET_NNODES (torchrun reads PET_* as its defaults).
- mpi-operator, MPIJob kubeflow.org/v2beta1 with mpiImplementation Intel (launcher only):
  K_MPI_JOB_ROLE=launcher, I_MPI_HYDRA_HOST_FILE=/etc/mpi/hostfile,
  I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS, I_MPI_PERHOST=<slotsPerWorker>; hostfile lines
  <job>-worker-<i>.<job>-worker.<ns>.svc:<slots>. Intel MPI passes the launcher's
  environment to every rank and adds PMI_RANK/PMI_SIZE/MPI_LOCALRANKID/MPI_LOCALNRANKS.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from corecpu.distributed.process_group import master_address
from corecpu.errors import CoreCPUError
from corecpu.cluster.launchers import detect_launcher
from helpers.common import ROOT
from helpers.kubernetes import POD, load, pytorchjob_pod_env

yaml = pytest.importorskip("yaml")
jsonschema = pytest.importorskip("jsonschema")

MPIJOB_LAUNCHER_ENV = {**POD, "K_MPI_JOB_ROLE": "launcher", "I_MPI_HYDRA_HOST_FILE": "/etc/mpi/hostfile",
                       "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS": "-o ConnectionAttempts=10", "I_MPI_PERHOST": "2",
                       "NVIDIA_VISIBLE_DEVICES": "", "NVIDIA_DRIVER_CAPABILITIES": ""}


# ---------------------------------------------------------------- launcher detection


def test_pytorchjob_pod_without_torchrun_is_one_rank_per_pod():
    env = pytorchjob_pod_env(rank=1)
    info = detect_launcher(env)
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) == \
        ("kubeflow-pytorchjob", 1, 2, 0, 1)
    # MASTER_ADDR is the master pod's service: the ranks span pods, and that is fine.
    assert master_address(env, info) == ("corecpu-train-master-0", 23456)


def test_pytorchjob_with_nproc_per_node_needs_torchrun():
    with pytest.raises(CoreCPUError) as err:
        detect_launcher(pytorchjob_pod_env(rank=0, nproc="2"))
    assert "torchrun" in str(err.value) and "\n" not in str(err.value)


def test_torchrun_child_in_a_pytorchjob_pod():
    # What torchrun gives its second child on the worker pod (node rank 1, 2 per node).
    env = {**pytorchjob_pod_env(rank=1, nproc="2"), "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
           "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1", "ROLE_RANK": "3", "TORCHELASTIC_RUN_ID": "none",
           "MASTER_ADDR": "corecpu-train-master-0", "MASTER_PORT": "23456"}
    info = detect_launcher(env)
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) == ("torchrun", 3, 4, 1, 2)


def test_mpijob_intel_rank():
    env = {**MPIJOB_LAUNCHER_ENV, "PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2",
           "PMI_FD": "7", "MASTER_ADDR": "corecpu-mpi-worker-0.corecpu-mpi-worker.default.svc"}
    info = detect_launcher(env)
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) == ("intel-mpi", 3, 4, 1, 2)
    assert master_address(env, info)[0] == env["MASTER_ADDR"]


# ---------------------------------------------------------------- CRD schemas (the fields the examples use)

RESOURCES = {"type": "object", "additionalProperties": False,
             "properties": {"requests": {"type": "object"}, "limits": {"type": "object"}}}
CONTAINER = {
    "type": "object", "required": ["name", "image"], "additionalProperties": False,
    "properties": {
        "name": {"type": "string"}, "image": {"type": "string"}, "imagePullPolicy": {"type": "string"},
        "command": {"type": "array", "items": {"type": "string"}}, "args": {"type": "array", "items": {"type": "string"}},
        "env": {"type": "array", "items": {"type": "object", "required": ["name"]}},
        "ports": {"type": "array", "items": {"type": "object", "required": ["containerPort"]}},
        "resources": RESOURCES, "workingDir": {"type": "string"},
        "volumeMounts": {"type": "array", "items": {"type": "object", "required": ["name", "mountPath"]}},
        "securityContext": {"type": "object"}, "readinessProbe": {"type": "object"},
    },
}
POD_TEMPLATE = {
    "type": "object", "required": ["spec"], "additionalProperties": False,
    "properties": {
        "metadata": {"type": "object"},
        "spec": {"type": "object", "required": ["containers"], "additionalProperties": False, "properties": {
            "containers": {"type": "array", "minItems": 1, "items": CONTAINER},
            "volumes": {"type": "array", "items": {"type": "object", "required": ["name"]}},
            "securityContext": {"type": "object"}, "nodeSelector": {"type": "object"},
        }},
    },
}
RESTART = {"enum": ["Always", "OnFailure", "Never", "ExitCode"]}
REPLICA = {"type": "object", "required": ["template"], "additionalProperties": False,
           "properties": {"replicas": {"type": "integer", "minimum": 0}, "restartPolicy": RESTART, "template": POD_TEMPLATE}}
RUN_POLICY = {"type": "object", "additionalProperties": False, "properties": {
    "cleanPodPolicy": {"enum": ["All", "Running", "None"]}, "backoffLimit": {"type": "integer"},
    "ttlSecondsAfterFinished": {"type": "integer"}, "activeDeadlineSeconds": {"type": "integer"},
    "suspend": {"type": "boolean"}}}
METADATA = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}

# kubeflow/training-operator: manifests/base/crds/kubeflow.org_pytorchjobs.yaml
PYTORCHJOB = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "kubeflow.org/v1"}, "kind": {"const": "PyTorchJob"}, "metadata": METADATA,
        "spec": {"type": "object", "required": ["pytorchReplicaSpecs"], "additionalProperties": False, "properties": {
            "runPolicy": RUN_POLICY,
            "nprocPerNode": {"type": "string"},  # a string in the CRD: "auto", "cpu", or a number
            "pytorchReplicaSpecs": {"type": "object", "additionalProperties": False, "required": ["Master"],
                                    "properties": {"Master": REPLICA, "Worker": REPLICA}},
        }},
    },
}
# kubeflow/mpi-operator: manifests/base/kubeflow.org_mpijobs.yaml (v2beta1)
MPIJOB = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "kubeflow.org/v2beta1"}, "kind": {"const": "MPIJob"}, "metadata": METADATA,
        "spec": {"type": "object", "required": ["mpiReplicaSpecs"], "additionalProperties": False, "properties": {
            "slotsPerWorker": {"type": "integer", "minimum": 1},
            "mpiImplementation": {"enum": ["OpenMPI", "Intel", "MPICH"]},
            "sshAuthMountPath": {"type": "string"},
            "launcherCreationPolicy": {"enum": ["AtStartup", "WaitForWorkersReady"]},
            "runPolicy": RUN_POLICY,
            "mpiReplicaSpecs": {"type": "object", "additionalProperties": False, "required": ["Launcher", "Worker"],
                                "properties": {"Launcher": REPLICA, "Worker": REPLICA}},
        }},
    },
}


def pods(job: dict, key: str) -> dict[str, dict]:
    return {role: spec["template"]["spec"] for role, spec in job["spec"][key].items()}


@pytest.mark.parametrize("name, schema", [("pytorchjob.yaml", PYTORCHJOB), ("mpijob.yaml", MPIJOB)])
def test_manifest_matches_crd_fields(name, schema):
    jsonschema.validate(load(name), schema)


def test_schema_catches_a_misspelled_field():
    job = load("mpijob.yaml")
    job["spec"]["slotPerWorker"] = job["spec"].pop("slotsPerWorker")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(job, MPIJOB)


def _cpu(value) -> float:
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


@pytest.mark.parametrize("name, key", [("pytorchjob.yaml", "pytorchReplicaSpecs"), ("mpijob.yaml", "mpiReplicaSpecs")])
def test_pods_get_exclusive_cpus_and_shared_memory(name, key):
    for role, spec in pods(load(name), key).items():
        c = spec["containers"][0]
        res = c["resources"]
        # requests == limits with whole CPUs: Guaranteed QoS, so the static CPU manager gives the
        # pod its own cpuset; without it the limit becomes cpu.max, which corecpu treats as the budget.
        assert res["requests"] == res["limits"], (name, role)
        assert _cpu(res["limits"]["cpu"]).is_integer(), (name, role)
        shm = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"]
        assert shm, f"{name} {role}: /dev/shm not mounted (the container default is 64 MB)"
        vol = next(v for v in spec["volumes"] if v["name"] == shm[0]["name"])
        assert vol["emptyDir"]["medium"] == "Memory", (name, role)


def test_pytorchjob_runs_torchrun_with_the_operator_variables():
    job = load("pytorchjob.yaml")
    for role, spec in pods(job, "pytorchReplicaSpecs").items():
        c = spec["containers"][0]
        assert c["name"] == "pytorch", "the training operator finds its container by this name"
        assert {"name": "pytorchjob-port", "containerPort": 23456} in [
            {k: p[k] for k in ("name", "containerPort")} for p in c["ports"]]
        argv = c["command"] + c.get("args", [])
        assert argv[0] == "torchrun"
        # torchrun reads PET_NNODES/PET_NPROC_PER_NODE/PET_NODE_RANK itself; the master comes from MASTER_*
        assert "--master-addr=$(MASTER_ADDR)" in argv and "--master-port=$(MASTER_PORT)" in argv
        assert not any(a.startswith(("--nnodes", "--nproc-per-node", "--node-rank")) for a in argv)
        assert argv[argv.index("--no-python") + 1:][:4] == ["python", "-m", "corecpu.bind", "--"]
    assert job["spec"]["nprocPerNode"].isdigit()


def test_mpijob_rank_count_matches_workers_and_slots():
    job = load("mpijob.yaml")
    spec = job["spec"]
    assert spec["mpiImplementation"] == "Intel"
    workers, slots = spec["mpiReplicaSpecs"]["Worker"]["replicas"], spec["slotsPerWorker"]
    launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    script = " ".join(launcher["command"] + launcher.get("args", []))
    n = re.search(r"mpirun\s+-n\s+(\d+)", script)
    assert n and int(n.group(1)) == workers * slots, script
    assert "I_MPI_HYDRA_HOST_FILE" in script and "MASTER_ADDR" in script and "I_MPI_PIN=0" in script
    worker = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["command"][0].endswith("sshd")
    # each worker's CPUs cover its slots with whole cores
    assert _cpu(worker["resources"]["limits"]["cpu"]) >= slots
    assert spec["sshAuthMountPath"].startswith("/home/corecpu/")


def test_launcher_script_exports_the_first_worker(tmp_path):
    """Run the launcher's script with the operator's variables and a stand-in mpirun."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash not found")
    launcher = load("mpijob.yaml")["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    hostfile = tmp_path / "hostfile"  # what the operator writes for 2 workers with 2 slots
    hostfile.write_text("corecpu-mpi-worker-0.corecpu-mpi-worker.default.svc:2\n"
                        "corecpu-mpi-worker-1.corecpu-mpi-worker.default.svc:2\n")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "mpirun").write_text('#!/bin/sh\necho "MASTER_ADDR=$MASTER_ADDR I_MPI_PIN=$I_MPI_PIN ARGS=$*"\n')
    (bindir / "mpirun").chmod(0o755)
    env = {**MPIJOB_LAUNCHER_ENV, "I_MPI_HYDRA_HOST_FILE": str(hostfile), "PATH": f"{bindir}:/usr/bin:/bin"}
    argv = launcher["command"] + launcher.get("args", [])
    assert argv[0] == "bash"
    r = subprocess.run([bash, *argv[1:]], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("MASTER_ADDR=corecpu-mpi-worker-0.corecpu-mpi-worker.default.svc I_MPI_PIN=0 "), r.stdout
    assert "-m corecpu.bind -- python -u /opt/corecpu/train.py" in r.stdout


# ---------------------------------------------------------------- Dockerfile


def dockerfile() -> list[str]:
    # instructions with continuation lines joined
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_dockerfile_rules():
    lines = dockerfile()
    froms = [line for line in lines if line.upper().startswith("FROM ")]
    assert froms and all(re.match(r"FROM python:3\.\d+-slim", f) for f in froms), froms
    text = "\n".join(lines)
    assert "download.pytorch.org/whl/cpu" in text, "torch must come from PyTorch's CPU wheel index"
    assert re.search(r"-c \S*constraints\.txt", text), "torch pinned through constraints.txt"
    assert re.search(r"^COPY .*corecpu", text, re.M), "the package is copied in"
    users = [line.split()[1] for line in lines if line.upper().startswith("USER ")]
    assert users and users[-1] not in ("root", "0"), "the image runs as a non-root user"
    assert "apt-get install" not in text or "--no-install-recommends" in text
    assert not re.search(r"^ADD ", text, re.M), "COPY, not ADD"
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignore and ".git" in ignore


def test_docker_build():
    """Builds the image where a container engine and the base image registry are reachable."""
    engine = next((e for e in ("docker", "podman", "buildah") if shutil.which(e)), None)
    if engine is None:
        pytest.skip("no docker/podman/buildah here")
    probe = subprocess.run([engine, "info"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"{engine} cannot reach its daemon: {(probe.stderr or probe.stdout).strip().splitlines()[-1]}")
    base = next(line.split()[1] for line in dockerfile() if line.upper().startswith("FROM "))
    pull = subprocess.run([engine, "pull", base], capture_output=True, text=True, timeout=300)
    if pull.returncode != 0:
        pytest.skip(f"base image {base} is not reachable from here: {pull.stderr.strip()[-200:]}")
    r = subprocess.run([engine, "build", "-t", "corecpu-test", str(ROOT)], capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([engine, "run", "--rm", "corecpu-test", "python", "-c",
                        "import torch, corecpu; assert torch.version.cuda is None; print(torch.__version__)"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "+cpu" in r.stdout, r.stdout + r.stderr
