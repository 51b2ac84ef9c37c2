"""Threads and CPU binding for one rank, decided before torch starts its thread pools.

launch.sh binds each rank through `python -m corecpu.bind` before Python even
imports torch. Other launchers differ: torchrun binds nothing and sets
OMP_NUM_THREADS=1, Ray sets it to the worker's CPU resource (1 by default) and binds
nothing either; ipexrun and Intel MPI pin each rank to its own CPUs. The
rule here: respect a binding someone else made, and where nobody bound this
rank, plan this node's cores (the same plan `bind` makes) and bind in-process,
so that ranks never all run on every core. A launcher's OMP_NUM_THREADS is
replaced by the plan's count; a person chooses threads with --threads (threads=).

The user need not import corecpu before torch: the CPUs a rank was given are
known from CORECPU_BOUND_CPUS (bind), or from the affinity at `import corecpu`,
or from the affinity now. Only when torch loaded first *and* an OpenMP binding
variable was set (libgomp then pins the loading thread to one CPU) is the
original set lost; `launcher_cpus` says so.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, MutableMapping

from corecpu import envvars
from corecpu.cluster.launchers import LaunchInfo
from corecpu.cpu.cgroups import quota_threads, read_cpu_quota, read_cpuset
from corecpu.cpu.cpulist import format_cpu_list, parse_cpu_list
from corecpu.cpu.node_plan import NodePlan
from corecpu.errors import CoreCPUError

BOUND_VAR, PLAN_NOTE_VAR, DECISION_VAR = envvars.BOUND_CPUS, envvars.PLAN_NOTE, envvars.THREADS_DECISION

# Read at `import corecpu` (the package imports this module): with OMP_PROC_BIND set (by
# ipexrun, or by corecpu.bind's plan) libgomp pins the loading thread to the first of the
# rank's CPUs as torch loads, and the set the launcher gave the rank is no longer visible.
CPUS_AT_START = frozenset(os.sched_getaffinity(0))
TORCH_LOADED_FIRST = "torch" in sys.modules
_OMP_BINDING_VARS = ("OMP_PROC_BIND", "OMP_PLACES", "KMP_AFFINITY", "GOMP_CPU_AFFINITY")


def launcher_cpus(env: Mapping[str, str]) -> tuple[frozenset[int], str | None]:
    """The CPUs the launcher gave this process, and a warning when they can no longer be known."""
    if env.get(BOUND_VAR):
        return frozenset(parse_cpu_list(env[BOUND_VAR])), None
    if TORCH_LOADED_FIRST and any(env.get(v) for v in _OMP_BINDING_VARS):
        bound = [v for v in _OMP_BINDING_VARS if env.get(v)]
        return CPUS_AT_START, (f"torch was imported before corecpu with {bound[0]} set, so OpenMP may already have "
                               f"pinned this process to {len(CPUS_AT_START)} CPU(s); import corecpu first, or start "
                               "the rank through corecpu.bind (launch.sh does)")
    return CPUS_AT_START, None


@dataclass(frozen=True)
class ThreadDecision:
    threads: int
    bind_to: frozenset[int] | None  # CPUs to bind this process to in-process, if any
    reason: str
    launcher_bound: bool = False  # another launcher (ipexrun, Intel MPI's pinning, numactl) chose the CPUs


def thread_budget(env: Mapping[str, str], info: LaunchInfo, quota_threads: int | None) -> tuple[int | None, str]:
    """Pure. The most busy threads one rank should run, and why; (None, "") when nothing limits it.

    Slurm's --cpus-per-task is per task: per rank under srun, and under mpirun inside the
    allocation (one rank per task). Not under torchrun, whose one task holds all local
    ranks; its affinity already says what the task got. A cgroup CPU quota (a Kubernetes pod's CPU limit,
    cpu.max) is shared by every rank in the container, so each gets its share of it: more
    threads than the quota sustains only get throttled.
    """
    limits: list[tuple[int, str]] = []
    cpus_per_task = env.get("SLURM_CPUS_PER_TASK", "")
    if cpus_per_task.isdigit() and int(cpus_per_task) > 0 and info.cpus_per_task_per_rank:
        limits.append((int(cpus_per_task), f"SLURM_CPUS_PER_TASK={cpus_per_task}"))
    if quota_threads is not None:
        share = max(1, quota_threads // info.local_world_size)
        limits.append((share, f"the cgroup CPU quota ({quota_threads} CPU(s) for {info.local_world_size} local rank(s))"))
    return min(limits) if limits else (None, "")


def decide_threads(
    requested: int,
    env: Mapping[str, str],
    affinity: frozenset[int],
    unbound_set: frozenset[int],
    info: LaunchInfo,
    planned_cpus: frozenset[int] | None,
    budget: tuple[int | None, str] = (None, ""),
    planned_threads: int | None = None,
) -> ThreadDecision:
    """Pure. `unbound_set` is what an unbound process may use (container cpuset or all online CPUs);
    `planned_cpus` is this rank's affinity from the topology plan, computed by the caller, and
    `planned_threads` its thread count (fewer than the CPUs under a numa binding); `budget`
    is thread_budget()'s answer, which caps every rule but an explicit --threads."""
    if requested > 0:
        return ThreadDecision(requested, None, "--threads")
    decision = _decide_from_binding(env, affinity, unbound_set, info, planned_cpus, planned_threads)
    limit, why = budget
    if limit is not None and decision.threads > limit:
        return dataclasses.replace(decision, threads=limit, reason=f"{decision.reason}; capped at {limit} by {why}")
    return decision


def _decide_from_binding(
    env: Mapping[str, str],
    affinity: frozenset[int],
    unbound_set: frozenset[int],
    info: LaunchInfo,
    planned_cpus: frozenset[int] | None,
    planned_threads: int | None = None,
) -> ThreadDecision:
    if env.get(BOUND_VAR):
        omp = env.get("OMP_NUM_THREADS", "")
        return ThreadDecision(int(omp) if omp.isdigit() and int(omp) > 0 else len(affinity), None, "bound by corecpu.bind")
    if affinity < unbound_set:
        # Someone (ipexrun, Intel MPI's pinning, numactl, taskset) gave this rank its own CPUs.
        return ThreadDecision(len(affinity), None, f"launcher bound this rank to {len(affinity)} CPU(s)", True)
    if info.local_world_size == 1:
        return ThreadDecision(len(affinity), None, "only rank on this host")
    if planned_cpus:
        return ThreadDecision(planned_threads or len(planned_cpus), planned_cpus, "planned and bound in-process")
    share = max(1, len(affinity) // info.local_world_size)
    return ThreadDecision(share, None, "cores divided by local ranks")


def check_omp_num_threads(env: Mapping[str, str]) -> None:
    """A set OMP_NUM_THREADS must be what OpenMP accepts: whole numbers >= 1, one per nesting level ("4" or
    "4,1"). libgomp ignores anything else with a line of its own, and corecpu replaced it without a word."""
    value = env.get("OMP_NUM_THREADS")
    if value is None or value.strip() == "":
        return
    if not all(part.strip().isdigit() and int(part) > 0 for part in value.split(",")):
        raise CoreCPUError(f"OMP_NUM_THREADS={value!r} is not a number of threads; export OMP_NUM_THREADS=4 "
                           "(a whole number >= 1), or unset it and corecpu picks each rank's threads")


def configure_threads(info: LaunchInfo, requested: int, affinity: frozenset[int] | None = None,
                      node: NodePlan | None = None, *, env: MutableMapping[str, str]) -> ThreadDecision:
    """Apply decide_threads to this process. Call before any torch operation runs. `node` is this
    node's plan, shared with whoever else needs it (computed here only if this rank must be bound).

    `env` is setup()'s environment, read for the launcher's and corecpu.bind's variables and written with
    OMP_NUM_THREADS, the decision and the comm thread's CPU. Pass os.environ in a rank (setup() does):
    OpenMP and child processes read the real one. A dict keeps a test's process untouched (the affinity
    and torch's thread count still change)."""
    check_omp_num_threads(env)
    if affinity is None:
        affinity, _ = launcher_cpus(env)
    online = _online_cpus() or affinity
    cpuset = read_cpuset()
    unbound = frozenset(cpuset) if cpuset else online
    planned, planned_threads = None, None
    if requested <= 0 and not env.get(BOUND_VAR) and not affinity < unbound and info.local_world_size > 1:
        share = (node or NodePlan(info, env)).for_rank
        planned = frozenset(share[1].pin_cpus) if share else None
        planned_threads = share[1].omp_num_threads if share else None
        if share and share[1].comm_cpu is not None:  # as corecpu.bind exports it for the ranks it starts
            env[envvars.COMM_CPU] = str(share[1].comm_cpu)
    budget = thread_budget(env, info, quota_threads(read_cpu_quota()))
    decision = decide_threads(requested, env, affinity, unbound, info, planned, budget, planned_threads)
    if decision.bind_to:
        bind_process(decision.bind_to)
    env["OMP_NUM_THREADS"] = str(decision.threads)
    env[DECISION_VAR] = decision.reason
    import torch  # here, not at the top: corecpu.cpu stays importable before torch (corecpu.bind)

    torch.set_num_threads(decision.threads)
    return decision


def bind_process(cpus: frozenset[int]) -> None:
    """Pin every thread of this process to `cpus` (threads started later inherit the caller's mask). A rank bound
    in-process may already run its launcher's threads: a Ray Train worker has some thirty (gRPC, Ray's core
    worker, gloo's for Ray's process group). Left on every CPU they would run on the other ranks' cores, and
    process_cpus() (the union over threads) would record this rank as running everywhere."""
    os.sched_setaffinity(0, cpus)
    for task in Path("/proc/self/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except (OSError, ValueError):
            continue  # the thread exited while we looked


def binding_of(decision: ThreadDecision, env: Mapping[str, str],
               planned: Callable[[], tuple[str, str]]) -> dict[str, str]:
    """{"binding": core|numa|launcher|none, "binding_reason": why} for the record. `planned()` is the node plan's
    (binding, why), asked only when this process bound itself from it."""
    if env.get(BOUND_VAR):
        return {"binding": env.get(envvars.BINDING, "core"),
                "binding_reason": env.get(envvars.BINDING_REASON, "corecpu.bind")}
    if decision.bind_to:
        binding, why = planned()
        return {"binding": binding, "binding_reason": why}
    if decision.launcher_bound:
        return {"binding": "launcher", "binding_reason": decision.reason}
    return {"binding": "none", "binding_reason": decision.reason}


def _online_cpus() -> frozenset[int] | None:
    try:
        return frozenset(parse_cpu_list(Path("/sys/devices/system/cpu/online").read_text().strip()))
    except (OSError, ValueError):
        return None


def process_cpus() -> list[int]:
    """CPUs this process runs on: the union over its threads, since OpenMP may bind each
    thread to one CPU of the rank's set (sched_getaffinity(0) sees only the calling thread)."""
    cpus: set[int] = set()
    for status in Path("/proc/self/task").glob("*/status"):
        try:
            for line in status.read_text().splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    cpus |= set(parse_cpu_list(line.split(":", 1)[1].strip()))
        except OSError:
            continue  # the thread exited while we looked
    return sorted(cpus or os.sched_getaffinity(0))


def binding_report(env: Mapping[str, str]) -> dict:
    """What this rank actually runs on, as seen from inside it (for OUTPUT_DIR/topology.json). `env`: the one
    configure_threads wrote to."""
    import torch  # as in configure_threads: keep corecpu.cpu torch-free at import

    # OpenMP starts its threads at the first parallel region, and with OMP_PROC_BIND the main thread alone is
    # pinned to the first CPU until then: one rank with 2 threads on CPUs 0-1 reported "0". A region that
    # splits (more elements than ATen's grain of 32768) starts them, so the union over threads is the rank's.
    torch.ones(1 << 16).add_(1)
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "cpus": process_cpus(),
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": env.get("OMP_NUM_THREADS"),
        "binding": env.get(DECISION_VAR, "not configured"),
        "gloo_socket_ifname": env.get("GLOO_SOCKET_IFNAME"),
        "plan_note": env.get(PLAN_NOTE_VAR),
    }


def threads_warning(requested: int, rank_cpus: frozenset[int] | set[int]) -> str | None:
    """A warning when more compute threads are asked for than this rank has CPUs; None otherwise.

    Threads beyond the CPUs take turns on them and every OpenMP barrier waits for the slowest
    turn: 25x slower was measured with threads= far above a rank's cores. A warning, not an
    error, because oversubscribing on purpose (for a test) is legitimate.
    """
    if requested <= len(rank_cpus) or not rank_cpus:
        return None
    return (f"{requested} threads requested but this rank has {len(rank_cpus)} CPU(s) ({format_cpu_list(sorted(rank_cpus))}): "
            f"threads will share CPUs and run much slower; use threads={len(rank_cpus)} or fewer (0: one per CPU)")
