"""`--allreduce auto`: which gradient path a run uses, measured on the job's own ranks where there is a choice.

choose_allreduce (corecpu.distributed.allreduce) names the path the rules allow; where more than one
path can run here (gloo or ccl, DDP's own; the Intel MPI hook when MPI started the ranks; DeepSpeed's
shared-memory op when the `shm` extra is installed), every rank times them together and the fastest
wins (corecpu.distributed.allreduce_choice, cached per kind of machine). The winner's object is kept
for run.wrap(), so an MPI or shared-memory set-up is not paid twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Mapping

from corecpu.cluster.launchers import LaunchInfo
from corecpu.cpu.hardware import read_cpu_features
from corecpu.cpu.node_plan import NodePlan
from corecpu.distributed import process_group as _pg
from corecpu.distributed.allreduce import GradientAllreduce, make_gradient_allreduce, mpi4py_importable
from corecpu.distributed.allreduce_choice import cache_key, cached, cached_pick, choose_by_measurement
from corecpu.distributed.shm_allreduce import shm_status

if TYPE_CHECKING:
    import torch


def candidates(info: LaunchInfo, backend: str, mpi_ok: Callable[[], tuple[bool, str]] = mpi4py_importable,
               shm_ok: Callable[[], tuple[bool, str]] = shm_status) -> list[str]:
    """The paths that can run for this rank, DDP's own first (it wins a tie: no extra thread). gloo is
    always one: whatever else wins must have beaten it."""
    paths = ["ccl", "gloo"] if backend == "ccl" else ["gloo"]
    if info.mpi_world and mpi_ok()[0]:
        paths.append("mpi")
    if shm_ok()[0]:
        paths.append("shm")
    return paths


def _key(info: LaunchInfo, order: list[str], busy: bool = False) -> str:
    """The cache key of a timing of `order`: per kind of machine, layout, torch and load state. `busy` is what
    launch.sh measured just before starting the ranks (setup() reads it once); elsewhere no sign of load."""
    import torch

    return cache_key(read_cpu_features().model_name, info.world_size, info.local_world_size, torch.get_num_threads(),
                     order, torch.__version__, busy, mpi=info.launcher)


def cached_winner_without_ccl(info: LaunchInfo, mpi_ok: Callable[[], tuple[bool, str]] = mpi4py_importable,
                              shm_ok: Callable[[], tuple[bool, str]] = shm_status, *, busy: bool = False) -> str:
    """Rank 0, before the process group exists (for --backend auto with ccl usable): why to start gloo instead
    of ccl, or "" to keep ccl. Gloo when this host's cached timing of the ccl candidates picked another path:
    the process group would then carry only control messages, and a ccl one costs about a second more to
    start (measured: 1.2 s against gloo's 0.1 s on a 2-vCPU Xeon, plus 0.5 s for its first collective)."""
    order = candidates(info, "ccl", mpi_ok, shm_ok)
    known = cached_pick(cached(_key(info, order, busy)), order) if len(order) > 1 else None
    if known is None or known[0] == "ccl":
        return ""  # ccl won, or nothing measured yet: start ccl, so that it can be timed with the others
    choice, why = known
    return (f"the gradients go over {choice} here ({why}, cached), so the process group carries only control "
            "messages and gloo starts faster")


def settle(requested: str, dtype: str, info: LaunchInfo, backend: str, node: NodePlan | None, path: str,
           reason: str, backend_requested: str = "auto", ccl_skipped: bool = False, *, busy: bool = False
           ) -> tuple[str, str, GradientAllreduce | None]:
    """Collective for auto with more than one rank: (path, why, the winner's object or None). Anything else
    passes `path` and `reason` through, as does an explicit `--backend ccl` (`backend_requested`): a user
    who names ccl gets DDP's buckets on it, unmeasured. `ccl_skipped`: --backend auto started gloo because
    the cached timing with ccl among the candidates picked another path; that timing decides here too."""
    if requested != "auto" or not info.distributed or dtype != "fp32" or backend_requested == "ccl":
        return path, reason, None
    everyone = _pg.gather_objects(candidates(info, backend))
    order = [p for p in everyone[0] if all(p in other for other in everyone)]  # a path must run on every rank
    if len(order) < 2:
        return path, reason, None
    if ccl_skipped:
        with_ccl = ["ccl", *order]
        known = cached_pick(_pg.gather_objects(cached(_key(info, with_ccl, busy)) if info.rank == 0 else None)[0], with_ccl)
        if known is not None and known[0] in order:
            return known[0], known[1] + " (cached)", None
    key = _key(info, order, busy)
    built: dict[str, GradientAllreduce] = {}

    def make_paths() -> Mapping[str, Callable[["torch.Tensor"], "torch.futures.Future"]]:
        scale = 1.0 / info.world_size
        for p in order:
            built[p] = make_gradient_allreduce(p, info, node)
        return {p: (lambda h: lambda t: h.allreduce_async(t, scale))(h) for p, h in built.items()}

    try:
        choice, why = choose_by_measurement(order, make_paths, key, info.rank, _pg.gather_objects, _pg.barrier)
    except BaseException:
        for h in built.values():
            h.close()
        raise
    keep = built.pop(choice, None)
    for h in built.values():
        h.close()
    return choice, why, keep


__all__ = ["cached_winner_without_ccl", "candidates", "settle"]
