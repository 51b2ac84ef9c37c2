"""oneCCL's environment for one rank: the node plan's worker and transport settings, plus the launcher's.

Torch-free and applied before the bindings import (oneCCL reads these when its first communicator is made).
What the user exported wins; corecpu only fills in what is missing, and says what it filled in.
"""

from __future__ import annotations

from typing import Callable, Mapping, MutableMapping

from corecpu.cluster.launchers import LaunchInfo

# oneCCL's own name for how ranks were started. Its `hydra` launcher is Intel MPI's (mpirun, and ipexrun,
# which runs Intel MPI's mpirun); everything else (torchrun, srun, Open MPI, Kubernetes) is `none`: the
# bindings exchange oneCCL's addresses through the c10d store, so no PMI is needed.
PROCESS_LAUNCHERS = {"intel-mpi": "hydra"}
SHOWN = ("CCL_WORKER_OFFLOAD", "CCL_WORKER_COUNT", "CCL_WORKER_AFFINITY", "CCL_ATL_TRANSPORT", "CCL_ATL_SHM",
         "CCL_PROCESS_LAUNCHER")


def process_launcher(launcher: str) -> str:
    """Pure: CCL_PROCESS_LAUNCHER for a corecpu.cluster launcher name."""
    return PROCESS_LAUNCHERS.get(launcher, "none")


def ccl_settings(environ: Mapping[str, str], plan_env: Mapping[str, str], info: LaunchInfo) -> dict[str, str]:
    """Pure: the variables to add to `environ` (those it lacks) from the plan and the launcher."""
    wanted = {k: v for k, v in plan_env.items() if k.startswith("CCL_")}
    wanted["CCL_PROCESS_LAUNCHER"] = process_launcher(info.launcher)
    if wanted["CCL_PROCESS_LAUNCHER"] == "none":
        # Without a launcher oneCCL must be told who shares the node. The bindings overwrite CCL_LOCAL_* from
        # LOCAL_RANK/LOCAL_WORLD_SIZE, or else from the global rank and size (wrong on several nodes), unless
        # PMI variables are present (Open MPI's PMIX_RANK): set both pairs from what the launcher said.
        local = {"rank": str(info.local_rank), "size": str(info.local_world_size)}
        wanted.update(CCL_LOCAL_RANK=local["rank"], CCL_LOCAL_SIZE=local["size"],
                      LOCAL_RANK=local["rank"], LOCAL_WORLD_SIZE=local["size"])
    out = {k: v for k, v in wanted.items() if not environ.get(k)}  # an empty value (ipexrun's affinity) is unset
    if environ.get("CCL_WORKER_COUNT", "").strip() == "0":
        # `ipexrun --ccl-worker-count 0` (what a small machine needs) exports CCL_WORKER_COUNT=0, "no worker
        # cores", which oneCCL 2022 rejects at the first collective (worker_count >= 1). Its equivalent is one
        # worker that is never handed a collective: each progresses in the rank's own thread.
        out.update(CCL_WORKER_COUNT="1", CCL_WORKER_OFFLOAD="0")
    return out


def apply_ccl_env(environ: MutableMapping[str, str], plan_env: Callable[[], Mapping[str, str]], info: LaunchInfo) -> str:
    """Fill in oneCCL's variables; a short description of the settings in force, for the backend's reason."""
    zero_workers = environ.get("CCL_WORKER_COUNT", "").strip() == "0"
    environ.update(ccl_settings(environ, plan_env(), info))
    shown = ", ".join(f"{k}={environ[k]}" for k in SHOWN if k in environ)
    return shown + (" (CCL_WORKER_COUNT=0 as given, which oneCCL rejects, made 1 with CCL_WORKER_OFFLOAD=0)"
                    if zero_workers else "")
