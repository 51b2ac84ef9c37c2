"""oneCCL's per-rank environment: launcher mapping, plan settings filled in, the user's exports kept."""

from __future__ import annotations

from corecpu.cluster.launchers import LaunchInfo
from corecpu.distributed.ccl_env import apply_ccl_env, ccl_settings, process_launcher

MPI = LaunchInfo("intel-mpi", 3, 4, 1, 2)
SRUN = LaunchInfo("slurm", 3, 4, 1, 2)


def test_intel_mpi_is_hydra_and_everything_else_none():
    assert process_launcher("intel-mpi") == "hydra"
    for launcher in ("torchrun", "slurm", "openmpi", "mvapich", "kubeflow-pytorchjob", "single"):
        assert process_launcher(launcher) == "none"


def test_plan_settings_fill_in_but_never_override():
    plan = {"CCL_WORKER_OFFLOAD": "0", "CCL_WORKER_AFFINITY": "0,1", "OMP_PLACES": "cores"}
    got = ccl_settings({"CCL_WORKER_AFFINITY": "5,6", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, plan,
                       LaunchInfo("torchrun", 3, 4, 1, 2))
    assert got == {"CCL_WORKER_OFFLOAD": "0", "CCL_PROCESS_LAUNCHER": "none", "CCL_LOCAL_RANK": "1",
                   "CCL_LOCAL_SIZE": "2"}


def test_without_a_launcher_oneccl_is_told_the_local_layout_not_the_global_one():
    # srun on 2 nodes x 2: global rank 3 is local rank 1 of 2 (the bindings would otherwise say 3 of 4).
    got = ccl_settings({}, {}, SRUN)
    assert got["LOCAL_RANK"] == got["CCL_LOCAL_RANK"] == "1" and got["LOCAL_WORLD_SIZE"] == got["CCL_LOCAL_SIZE"] == "2"
    assert ccl_settings({}, {}, MPI) == {"CCL_PROCESS_LAUNCHER": "hydra"}  # hydra tells oneCCL itself


def test_apply_describes_what_is_in_force():
    env = {"CCL_ATL_SHM": "0"}
    said = apply_ccl_env(env, lambda: {"CCL_WORKER_OFFLOAD": "0", "CCL_ATL_SHM": "1"}, MPI)
    assert env == {"CCL_ATL_SHM": "0", "CCL_WORKER_OFFLOAD": "0", "CCL_PROCESS_LAUNCHER": "hydra"}
    assert said == "CCL_WORKER_OFFLOAD=0, CCL_ATL_SHM=0, CCL_PROCESS_LAUNCHER=hydra"
