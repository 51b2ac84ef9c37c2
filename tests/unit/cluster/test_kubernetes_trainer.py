"""Kubernetes, Kubeflow Trainer v2 (trainer.kubeflow.org/v1alpha1): the TrainJobs and ClusterTrainingRuntimes of
examples/kubernetes/ against Trainer v2.3.0's real CRDs (tests/crds/, strictly), the same guarantees as the
v1 manifests (tests/unit/cluster/test_kubernetes.py), and the Intel MPI launcher's script with the hostfile the
Trainer writes.

What the Trainer does, from its v2.3.0 sources (pkg/runtime/framework/plugins/{torch,mpi,jobset}, pkg/constants):
- Torch plugin, into the "node" container of the replicated job labelled trainjob-ancestor-step=trainer:
  PET_NNODES, PET_NPROC_PER_NODE (trainer.numProcPerNode; unset on CPU = the pod's CPU request), PET_NODE_RANK
  (the Job completion index), PET_MASTER_ADDR=<job>-node-0-0.<job>, PET_MASTER_PORT=29500. trainer.env must not
  set them. trainer.image/command/args replace that container's; resourcesPerNode is merged over its resources.
- MPI plugin (mpiImplementation OpenMPI, the CRD's one value): ssh keys (id_rsa, id_rsa.pub, authorized_keys) at
  sshAuthMountPath in every "node" container, /etc/mpi/hostfile with "<job>-node-0-<i>.<job> slots=<numProcPerNode>"
  lines and OMPI_MCA_orte_default_hostfile pointing at it in the launcher; without runLauncherAsNode,
  resourcesPerNode goes to the launcher (the ancestor-trainer job), not to the node pods.
The runtimes' JobSet template is spelled out in the CRD (no x-kubernetes-preserve-unknown-fields), so it is
validated down to the pods; the CRDs' CEL rules are not evaluated here, and the ones that matter are asserted.
"""

from __future__ import annotations

import re

import pytest

from helpers.crds import CRDS
from helpers.kubernetes import image_user, load, rename_key, run_with_stubs

pytest.importorskip("yaml")

TORCH, MPI = "runtime-torch.yaml", "runtime-intel-mpi.yaml"
JOBS = {"trainjob.yaml": TORCH, "trainjob-intel-mpi.yaml": MPI}  # each TrainJob and the runtime it runs on
RJ = ["spec", "template", "spec", "replicatedJobs"]
POD = ["template", "spec", "template", "spec"]  # from a replicated job to its pod spec


def replicated(runtime: dict) -> dict[str, dict]:
    return {r["name"]: r for r in runtime["spec"]["template"]["spec"]["replicatedJobs"]}


def pod(runtime: dict, job: str) -> dict:
    return replicated(runtime)[job]["template"]["spec"]["template"]["spec"]


def trainer_container(runtime: dict) -> dict:
    """The container the TrainJob's trainer.* lands in: "node" in the job labelled ancestor-step=trainer."""
    label = "trainer.kubeflow.org/trainjob-ancestor-step"
    jobs = [r for r in replicated(runtime).values()
            if r["template"].get("metadata", {}).get("labels", {}).get(label) == "trainer"]
    assert len(jobs) == 1, "exactly one replicated job carries the trainer ancestor label"
    containers = [c for c in jobs[0]["template"]["spec"]["template"]["spec"]["containers"] if c["name"] == "node"]
    assert len(containers) == 1, "the Trainer finds its container by the name 'node'"
    return containers[0]


def argv(job_file: str) -> list[str]:
    """What the trainer container runs: the runtime's command, then the TrainJob's args (the Trainer's rule)."""
    job, runtime = load(job_file), load(JOBS[job_file])
    assert job["spec"]["runtimeRef"] == {"name": runtime["metadata"]["name"]}  # kind: ClusterTrainingRuntime, the default
    assert "command" not in job["spec"]["trainer"], "the runtime's command does the binding; the job passes args"
    c = trainer_container(runtime)
    return c["command"] + job["spec"]["trainer"].get("args", c.get("args", []))


# ---------------------------------------------------------------- the upstream CRDs, strictly


@pytest.mark.parametrize("name", [*JOBS, TORCH, MPI])
def test_manifest_validates_against_the_trainer_crds(crds, name):
    assert crds.errors(load(name)) == []


def test_the_runtime_crd_spells_out_the_jobset_template(crds):
    """So the validation reaches the pods: if a newer CRD made the template open, this says so."""
    import yaml

    crd = yaml.safe_load((CRDS / "trainer.kubeflow.org_clustertrainingruntimes.yaml").read_text())
    template = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["template"]
    assert "x-kubernetes-preserve-unknown-fields" not in str(template)
    assert "containers" in str(template["properties"]["spec"])


POD_TORCH = [*RJ, 0, *POD]
POD_MPI_NODE, POD_MPI_LAUNCHER = [*RJ, 0, *POD], [*RJ, 1, *POD]


@pytest.mark.parametrize("name, path, wrong", [
    (TORCH, ["spec", "mlPolicy", "torch"], "pytorch"),
    (TORCH, [*RJ[:-1], "failurePolicy", "maxRestarts"], "maxRestart"),
    (TORCH, [*RJ, 0, "template", "spec", "backoffLimit"], "backOffLimit"),
    (TORCH, [*POD_TORCH, "volumes", 1, "persistentVolumeClaim", "claimName"], "claimname"),
    (TORCH, [*POD_TORCH, "securityContext", "seccompProfile", "type"], "Type"),
    (TORCH, [*POD_TORCH, "containers", 0, "securityContext", "allowPrivilegeEscalation"], "allowPrivilegeEscalaton"),
    (TORCH, [*POD_TORCH, "containers", 0, "volumeMounts", 1, "mountPath"], "mountpath"),
    (MPI, ["spec", "mlPolicy", "mpi", "sshAuthMountPath"], "sshAuthPath"),
    (MPI, [*RJ, 1, "dependsOn", 0, "status"], "state"),
    (MPI, [*POD_MPI_NODE, "containers", 0, "readinessProbe", "tcpSocket", "port"], "prot"),
    (MPI, [*POD_MPI_LAUNCHER, "volumes", 0, "emptyDir", "sizeLimit"], "sizeLimt"),
    ("trainjob.yaml", ["spec", "trainer", "numProcPerNode"], "nprocPerNode"),
    ("trainjob.yaml", ["spec", "trainer", "resourcesPerNode", "limits"], "limit"),
    ("trainjob.yaml", ["spec", "runtimeRef", "name"], "Name"),
    ("trainjob-intel-mpi.yaml", ["spec", "trainer", "numNodes"], "replicas"),
])
def test_a_typo_at_any_depth_is_rejected(crds, name, path, wrong):
    obj = load(name)
    rename_key(obj, path, wrong)
    found = crds.errors(obj)
    assert found and any(repr(wrong) in e for e in found), found


def runtime_patch(**pod_spec) -> dict:
    """A TrainJob runtimePatches entry (Trainer >= v2.2) for the pods of the "node" job."""
    return {"manager": "example.com/user", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": {"spec": pod_spec}}}}]}}}}


def test_runtime_patches_are_validated_to_their_depth(crds):
    job = load("trainjob.yaml")
    job["spec"]["runtimePatches"] = [runtime_patch(
        nodeSelector={"node.kubernetes.io/instance-type": "c7i.8xlarge"},
        tolerations=[{"key": "cpu-only", "operator": "Exists", "effect": "NoSchedule"}])]
    assert crds.errors(job) == []
    tol = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    rename_key(tol, ["template", "spec", "template", "spec", "tolerations", 0, "effect"], "efect")
    assert any("'efect' was unexpected" in e for e in crds.errors(job))


def test_wrong_types_and_values_are_rejected(crds):
    job = load("trainjob.yaml")
    job["spec"]["trainer"]["numNodes"] = "2"  # an int32 in the CRD
    assert any("numNodes" in e for e in crds.errors(job))
    mpi = load(MPI)
    mpi["spec"]["mlPolicy"]["mpi"]["mpiImplementation"] = "Intel"  # v2.3 knows OpenMPI only: why the launcher converts
    assert any("mpiImplementation" in e for e in crds.errors(mpi))


def test_valid_upstream_fields_are_accepted(crds):
    """Fields the Trainer defines that the examples do not use: none may be refused."""
    job = load("trainjob.yaml")
    job["spec"].update(suspend=True, activeDeadlineSeconds=86400, managedBy="trainer.kubeflow.org/trainjob-controller")
    job["spec"]["runtimeRef"].update(apiGroup="trainer.kubeflow.org", kind="ClusterTrainingRuntime")
    job["spec"]["trainer"].update(image="registry.example.com/corecpu:0.2.0", env=[{"name": "CORECPU_X", "value": "1"}])
    assert crds.errors(job) == []
    runtime = load(TORCH)
    runtime["spec"]["podGroupPolicy"] = {"coscheduling": {"scheduleTimeoutSeconds": 120}}
    targets = [{"jobName": "node", "containerNames": ["sidecar"]}]
    runtime["spec"]["mlPolicy"]["torch"] = {"envInjection": {"targets": targets}}
    assert crds.errors(runtime) == []


def test_what_the_crds_cel_rules_say():
    """x-kubernetes-validations, which jsonschema does not run: one mlPolicy, RFC 1035 job names of <= 63."""
    for name, runtime in {TORCH: "torch", MPI: "mpi"}.items():
        policy = load(name)["spec"]["mlPolicy"]
        assert [k for k in ("torch", "mpi", "jax", "xgboost", "flux") if k in policy] == [runtime]
    for name in JOBS:
        job_name = load(name)["metadata"]["name"]
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", job_name) and len(job_name) <= 63


# ---------------------------------------------------------------- the guarantees of the v1 manifests


def _cpu(value) -> float:
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def rank_pods() -> dict[str, dict]:
    """Every pod spec that runs ranks: the torch "node" pods, the MPI "node" pods (mpirun's targets)."""
    return {"torch node": pod(load(TORCH), "node"), "mpi node": pod(load(MPI), "node")}


def test_every_pod_runs_as_the_images_numeric_user_under_the_restricted_level():
    uid = int(image_user())
    pods = {**rank_pods(), "mpi launcher": pod(load(MPI), "launcher")}
    for role, spec in pods.items():
        sc = spec["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == uid, role
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, role
        for c in spec["containers"]:
            csc = c["securityContext"]
            assert csc["allowPrivilegeEscalation"] is False and csc["capabilities"]["drop"] == ["ALL"], role


def test_rank_pods_get_exclusive_cpus_and_shared_memory():
    job = load("trainjob.yaml")["spec"]["trainer"]
    for role, spec in {**rank_pods(), "trainjob resourcesPerNode": {"containers": [
            {"resources": job["resourcesPerNode"]}]}}.items():
        res = spec["containers"][0]["resources"]
        # requests == limits in whole CPUs: Guaranteed QoS, an exclusive cpuset under the static CPU manager
        assert res["requests"] == res["limits"] and _cpu(res["limits"]["cpu"]).is_integer(), role
    for role, spec in rank_pods().items():
        shm = [m for m in spec["containers"][0]["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        vol = next(v for v in spec["volumes"] if shm and v["name"] == shm[0]["name"])
        assert vol["emptyDir"]["medium"] == "Memory", role


def test_every_rank_pod_mounts_the_shared_runs_claim():
    """--resume auto: every rank loads the checkpoint rank 0 picked, so all must see one ReadWriteMany volume."""
    pvc = load("runs-pvc.yaml")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    for job_file, runtime_file in JOBS.items():
        words = argv(job_file)
        assert "--resume=auto" in words, job_file
        out = next(w.split("=", 1)[1] for w in words if w.startswith("--output-dir="))
        spec = pod(load(runtime_file), "node")  # the ranks' pods in both runtimes
        mount = next(m for m in spec["containers"][0]["volumeMounts"] if out.startswith(m["mountPath"] + "/"))
        vol = next(v for v in spec["volumes"] if v["name"] == mount["name"])
        assert vol == {"name": mount["name"], "persistentVolumeClaim": {"claimName": pvc["metadata"]["name"]}}, job_file


def test_failures_restart_every_pod_together():
    """One pod alone restarted would wait for peers that are gone; the JobSet restarts all, and --resume=auto continues."""
    for name in (TORCH, MPI):
        runtime = load(name)
        assert runtime["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] >= 0
        for job in replicated(runtime).values():
            assert job["template"]["spec"]["backoffLimit"] == 0, (name, job["name"])
            assert job["template"]["spec"]["template"]["spec"]["restartPolicy"] == "Never", (name, job["name"])


# ---------------------------------------------------------------- binding inside the pod


def test_torch_runtime_runs_torchrun_then_corecpu_bind():
    runtime = load(TORCH)
    assert list(replicated(runtime)) == ["node"]  # the torch plugin's job name: PET_MASTER_ADDR is <job>-node-0-0
    words = argv("trainjob.yaml")
    assert words[:9] == ["torchrun", "--no-python", "python", "-m", "corecpu.bind", "--", "python", "-u",
                         "/opt/corecpu/train.py"]
    # torchrun takes nodes, ranks per node, node rank and the master from the Trainer's PET_* variables
    assert not any(w.startswith(("--nnodes", "--nproc-per-node", "--node-rank", "--master-")) for w in words)
    trainer = load("trainjob.yaml")["spec"]["trainer"]
    assert not any(e["name"].startswith("PET_") for e in trainer.get("env", []))  # reserved: the Trainer refuses them
    # unset, numProcPerNode on CPU is the pod's CPU count (one rank per CPU): the example says how many
    assert 1 <= trainer["numProcPerNode"] <= _cpu(trainer["resourcesPerNode"]["limits"]["cpu"])


def test_mpi_runtime_starts_the_launcher_once_the_nodes_are_ready():
    runtime = load(MPI)
    mpi = runtime["spec"]["mlPolicy"]["mpi"]
    assert mpi["mpiImplementation"] == "OpenMPI" and mpi["runLauncherAsNode"] is False
    assert mpi["sshAuthMountPath"].startswith("/home/corecpu/")
    jobs = replicated(runtime)
    assert jobs["launcher"]["dependsOn"] == [{"name": "node", "status": "Ready"}]
    assert runtime["spec"]["template"]["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["launcher"]}
    node = pod(runtime, "node")["containers"][0]
    assert node["name"] == "node" and node["command"][0].endswith("sshd")  # the ssh key is mounted into "node" containers
    assert node["readinessProbe"]["tcpSocket"]["port"] == 2222
    assert _cpu(node["resources"]["limits"]["cpu"]) >= mpi["numProcPerNode"]
    # resourcesPerNode would size the launcher in Trainer v2.3, not the node pods
    assert "resourcesPerNode" not in load("trainjob-intel-mpi.yaml")["spec"]["trainer"]


def run_launcher(tmp_path, nodes: int, slots: int, getent: str = "exit 0"):
    """The MPI launcher's command + the TrainJob's args, with the hostfile and variables the Trainer gives it."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"corecpu-mpi-node-0-{i}.corecpu-mpi slots={slots}\n" for i in range(nodes)))
    env = {"OMPI_MCA_orte_default_hostfile": str(hostfile), "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
           "OMPI_MCA_orte_set_default_slots": str(slots), "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10"}
    return run_with_stubs(tmp_path, argv("trainjob-intel-mpi.yaml"), env, getent)


@pytest.mark.parametrize("nodes, slots", [(2, 2), (3, 4)])
def test_launcher_converts_the_hostfile_and_runs_nodes_times_slots_ranks(tmp_path, nodes, slots):
    r = run_launcher(tmp_path, nodes, slots)
    assert r.returncode == 0, r.stderr
    first, hosts = r.stdout.splitlines()
    assert first == (f"MASTER_ADDR=corecpu-mpi-node-0-0.corecpu-mpi I_MPI_PIN=0 ARGS=-n {nodes * slots} "
                     "python -m corecpu.bind -- python -u /opt/corecpu/train.py "
                     "--model=tiny --resume=auto --output-dir=/runs/corecpu-mpi")
    assert hosts.split() == ["HOSTS=" + f"corecpu-mpi-node-0-0.corecpu-mpi:{slots}",
                             *(f"corecpu-mpi-node-0-{i}.corecpu-mpi:{slots}" for i in range(1, nodes))]


def test_launcher_gives_up_on_a_node_that_never_resolves(tmp_path):
    r = run_launcher(tmp_path, 2, 2, getent='case "$2" in *node-0-1*) exit 2;; esac')
    assert r.returncode != 0 and "ARGS=" not in r.stdout
    assert r.stderr.strip() == "launcher: node corecpu-mpi-node-0-1.corecpu-mpi does not resolve after 120 s; check its pod"


# ---------------------------------------------------------------- a TrainJob pod started without torchrun

TRAINJOB_POD = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "1",
                "PET_MASTER_ADDR": "corecpu-train-node-0-0.corecpu-train", "PET_MASTER_PORT": "29400"}


def test_trainjob_pod_without_torchrun_is_refused_not_trained_alone():
    from corecpu.cluster.launchers import detect_launcher
    from corecpu.errors import CoreCPUError
    with pytest.raises(CoreCPUError) as err:
        detect_launcher(TRAINJOB_POD)
    assert "torchrun" in str(err.value) and "\n" not in str(err.value)
    one = detect_launcher({**TRAINJOB_POD, "PET_NNODES": "1", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "0"})
    assert (one.launcher, one.rank, one.world_size) == ("kubeflow-trainjob", 0, 1)
    # torchrun's children carry RANK and LOCAL_RANK: read as torchrun, as any other torchrun job.
    child = detect_launcher({**TRAINJOB_POD, "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                             "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"})
    assert (child.launcher, child.rank, child.world_size, child.local_rank) == ("torchrun", 3, 4, 1)
