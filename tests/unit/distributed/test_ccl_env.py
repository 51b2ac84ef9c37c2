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


def test_ipexruns_zero_workers_become_one_that_never_offloads_and_empty_values_count_as_unset() -> None:
    from corecpu.cluster.launchers import detect_launcher
    from corecpu.distributed.ccl_env import apply_ccl_env

    # What `ipexrun cpu --ccl-worker-count 0` exports to every rank (it runs Intel MPI's mpirun).
    env = {"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2",
           "CCL_WORKER_COUNT": "0", "CCL_WORKER_AFFINITY": ""}
    plan = {"CCL_WORKER_COUNT": "1", "CCL_WORKER_AFFINITY": "0,1", "CCL_WORKER_OFFLOAD": "0", "CCL_ATL_SHM": "1"}
    why = apply_ccl_env(env, lambda: plan, detect_launcher(env))
    assert env["CCL_WORKER_COUNT"] == "1" and env["CCL_WORKER_OFFLOAD"] == "0"
    assert env["CCL_WORKER_AFFINITY"] == "0,1" and env["CCL_PROCESS_LAUNCHER"] == "hydra"
    assert "CCL_WORKER_COUNT=0 as given, which oneCCL rejects" in why
    # A count the user set to anything else stays theirs.
    mine = {**env, "CCL_WORKER_COUNT": "2"}
    apply_ccl_env(mine, lambda: plan, detect_launcher(mine))
    assert mine["CCL_WORKER_COUNT"] == "2"
