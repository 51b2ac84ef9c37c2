"""This node's plan and one rank's share of it: the one planning path for `corecpu.bind` (before
torch loads), `corecpu.setup()` (ranks nobody bound) and the MPI all-reduce (wait mode).

`NodePlan` computes it at most once per process, and only when something asks.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import replace
from typing import Mapping, MutableMapping

from corecpu import envvars
from corecpu.cluster.launchers import LaunchInfo
from corecpu.cpu.cpulist import format_cpu_list
from corecpu.cpu.hardware import ccl_installed
from corecpu.cpu.placement import Plan, PlanRequest, RankPlan, make_plan
from corecpu.cpu.sharing import SharingEvidence, decide_binding, gather_evidence
from corecpu.cpu.topology import Topology, read_topology


def plan_backend(environ: Mapping[str, str]) -> str:
    """The backend the plan reserves cores for: the one the launcher was asked for (CORECPU_BACKEND)."""
    asked = environ.get(envvars.BACKEND, "auto")
    if asked == "auto":
        return "ccl" if ccl_installed() else "gloo"
    return "ccl" if asked == "ccl" else "gloo"


def resolve_binding(requested: str, environ: Mapping[str, str], topology: Topology, *,
                    measure: bool) -> tuple[str, str]:
    """`requested` (auto|core|numa) -> (core|numa, why), from this node's evidence; `measure` samples the CPUs'
    load (only where no rank of this job is running yet: launch.sh, `corecpu plan`)."""
    if requested != "auto":
        return decide_binding(requested, SharingEvidence())
    evidence = gather_evidence(environ, topology.allowed, len(topology.online), measure=measure)
    return decide_binding("auto", evidence)


def plan_binding(environ: Mapping[str, str], requested: str = "auto",
                 topology: Topology | None = None) -> tuple[str, str]:
    """How tightly to pin, and why: `requested`, else what the launcher decided (launch.sh measures the
    CPUs' load before starting the ranks), else the static signs of exclusivity (no measuring here: the
    other ranks' own start-up would look like load)."""
    if requested == "auto" and environ.get(envvars.BINDING) in ("core", "numa"):
        return environ[envvars.BINDING], environ.get(envvars.BINDING_REASON) or f"{envvars.BINDING} set"
    if requested != "auto":
        return decide_binding(requested, SharingEvidence())
    return resolve_binding("auto", environ, topology or read_topology(allowed_from_cpuset=True, env=environ),
                           measure=False)


def plan_rank(info: LaunchInfo, environ: Mapping[str, str], topology: Topology | None = None,
              request: PlanRequest | None = None) -> tuple[Plan, RankPlan]:
    """This node's plan and this rank's share of it: the one planning path for `bind` and `corecpu.setup()`."""
    if topology is None:
        topology = read_topology(allowed_from_cpuset=True, env=environ)
    if request is None:
        request = PlanRequest(backend=plan_backend(environ), binding=plan_binding(environ, topology=topology)[0],
                              allocator=environ.get(envvars.ALLOCATOR, "auto"))
    # The launcher decides how many ranks exist; the plan can only make them fit.
    request = replace(request, nproc=info.local_world_size, allow_oversubscribe=True)
    if info.world_size == 1 and request.ccl_workers is None:
        # One process runs no collective: a core held for a CCL worker would idle (ResNet-50 on 2 AMX cores
        # ran at half speed with the oneCCL bindings installed), so plan as for gloo, every core computing.
        request = replace(request, backend="gloo")
    plan = make_plan(topology, request)
    return plan, plan.ranks[info.local_rank]


def rank_environment(plan: Plan, rank: RankPlan, environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` plus what the plan sets for this rank (threads, affinity variables, allocator, notes)."""
    env = dict(environ)
    for key, value in plan.env.items():
        if key.startswith(("CCL_", "I_MPI_WAIT_MODE")) and key in environ:
            continue  # oneCCL and MPI wait settings the user exported (e.g. to compare) win over the plan's
        if key == "LD_PRELOAD":
            # Keep whatever the user preloads; ours first so the allocator wins.
            existing = [p for p in environ.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p]
            value = ":".join(dict.fromkeys(value.split(":") + existing))
        env[key] = value
    env["OMP_NUM_THREADS"] = str(rank.omp_num_threads)
    env[envvars.BOUND_CPUS] = format_cpu_list(rank.pin_cpus)
    if rank.comm_cpu is not None:
        env[envvars.COMM_CPU] = str(rank.comm_cpu)
    if plan.warnings or plan.notes:
        env[envvars.PLAN_NOTE] = "; ".join(plan.warnings + plan.notes)
    return env


class NodePlan:
    """This node's plan for the rank `info` describes, computed on first use and then kept."""

    def __init__(self, info: LaunchInfo, environ: MutableMapping[str, str], binding: str = "auto") -> None:
        # setup()'s `env`: threads and the MPI all-reduce write what OpenMP and MPI must read there.
        self.info, self.environ, self.requested_binding = info, environ, binding

    @functools.cached_property
    def binding(self) -> tuple[str, str]:
        """("core" | "numa", why): see plan_binding."""
        return plan_binding(self.environ, self.requested_binding)

    @functools.cached_property
    def for_rank(self) -> tuple[Plan, RankPlan] | None:
        """(plan, this rank's share), or None when planning failed (said once on stderr)."""
        try:
            request = PlanRequest(backend=plan_backend(self.environ), binding=self.binding[0],
                                  allocator=self.environ.get(envvars.ALLOCATOR, "auto"))
            return plan_rank(self.info, self.environ, request=request)
        except Exception as exc:  # planning is an optimisation in a running rank, never a reason to stop
            print(f"corecpu: warning: could not plan CPU binding ({exc}); dividing cores evenly", file=sys.stderr)
            return None

    @property
    def env(self) -> Mapping[str, str]:
        """The plan's environment for every rank (I_MPI_WAIT_MODE, ...); empty without a plan, and empty
        when corecpu.bind already planned this rank and put that environment in place."""
        if self.environ.get(envvars.BOUND_CPUS):
            return {}
        return self.for_rank[0].env if self.for_rank else {}
