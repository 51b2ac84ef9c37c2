"""Placement: which CPUs each local rank of a node computes on, and the environment that makes it so.

`make_plan(topology, request)` is pure: same inputs, same plan, no I/O. The rules:
a rank keeps to one NUMA node whenever the numbers allow, ranks never share a
physical core, hyperthread siblings stay with their core's rank, and every
allowed CPU left idle is named in a note with the reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from dataclasses import dataclass, field
from typing import Literal, Mapping

from corecpu.errors import CoreCPUError
from corecpu import envvars
from corecpu.cpu import busy_threads
from corecpu.cpu.allocator import ALLOCATORS, chosen_allocator
from corecpu.cpu.ccl_workers import ccl_environment
from corecpu.cpu.cpulist import format_cpu_list, parse_cpu_list
from corecpu.cpu.rank_placement import RankPlan
from corecpu.cpu.topology import Topology

KMP_AFFINITY = "granularity=fine,compact,1,0"
# core: each rank pinned to its own cores (right when the CPUs are the job's alone).
# numa: each rank may run anywhere on its NUMA node(s), with the same thread count: the scheduler can move
# a rank off a core a neighbour's process landed on, instead of halving that rank and the whole job.
BINDINGS = ("core", "numa")


@dataclass(frozen=True)
class PlanRequest:
    nproc: int | Literal["auto"] = "auto"  # ranks on this node; auto = one per NUMA node with allowed CPUs
    backend: str = "gloo"
    ccl_workers: int | None = None  # None: 1 for the ccl backend where every rank can spare a core, else 0
    use_logical_cores: bool = False
    numa_nodes: tuple[int, ...] | None = None  # restrict to these nodes
    allow_oversubscribe: bool = False  # more ranks than CPUs: 1 thread each, CPUs shared
    binding: str = "core"  # one of BINDINGS
    allocator: str = "auto"  # one of ALLOCATORS (CORECPU_ALLOCATOR): which malloc the ranks preload

    @property
    def ccl_worker_count(self) -> int:
        if self.ccl_workers is not None:
            return self.ccl_workers
        return 1 if self.backend == "ccl" else 0


@dataclass(frozen=True)
class Plan:
    topology: Topology
    request: PlanRequest
    ranks: tuple[RankPlan, ...]
    env: Mapping[str, str] = field(default_factory=dict)  # shared by every rank on the node
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    oversubscribed: bool = False
    binding_reason: str = ""  # why request.binding (the caller's decision, e.g. from corecpu.cpu.sharing)

    def to_json(self) -> dict:
        return {
            "machine": self.topology.summary(),
            "request": {
                "nproc": self.request.nproc,
                "backend": self.request.backend,
                "ccl_workers": self.request.ccl_worker_count,
                "use_logical_cores": self.request.use_logical_cores,
                "numa_nodes": list(self.request.numa_nodes) if self.request.numa_nodes else None,
                "allow_oversubscribe": self.request.allow_oversubscribe,
                "binding": self.request.binding,
            },
            "binding_reason": self.binding_reason,
            "ranks": [
                {
                    "rank": r.local_rank,
                    "cpus": r.cpulist,
                    "cpu_ids": list(r.cpus),
                    "affinity": format_cpu_list(r.pin_cpus),
                    "comm_cpu": r.comm_cpu,
                    "numa_node": r.numa_node,
                    "omp_num_threads": r.omp_num_threads,
                    "ccl_worker_cpus": list(r.ccl_worker_cpus),
                    "cores": r.cores,
                    "membind": " ".join(r.membind),
                }
                for r in self.ranks
            ],
            "env": dict(self.env),
            "oversubscribed": self.oversubscribed,
            "notes": list(self.notes),
            "warnings": list(self.warnings),
        }

    def to_shell(self) -> str:
        """`export` lines for the shared env; per-rank settings as comments (they differ by rank)."""
        lines = [f"# corecpu plan: {len(self.ranks)} local rank(s); binding {self.request.binding}"
                 + (f" ({self.binding_reason})" if self.binding_reason else "")]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in self.env.items()]
        for r in self.ranks:
            prefix = " ".join(r.membind) or "(no memory binding)"
            workers = f" / ccl workers on {format_cpu_list(r.ccl_worker_cpus)}" if r.ccl_worker_cpus else ""
            lines.append(f"# rank {r.local_rank}: {prefix} / cpus {r.cpulist} / OMP_NUM_THREADS={r.omp_num_threads}{workers}")
        lines += [f"# note: {n}" for n in self.notes]
        lines += [f"# warning: {w}" for w in self.warnings]
        return "\n".join(line.replace("\n", " ") for line in lines) + "\n"


@dataclass
class _Unit:
    """What a rank is handed: a physical core, or one hyperthread when ranks outnumber cores."""

    node: int
    cpus: tuple[int, ...]  # allowed CPUs of the unit, primary thread first


def pin_domain(ranks: tuple[RankPlan, ...]) -> str:
    # Intel MPI <masklist>: one hex mask per rank, bit i = logical CPU i.
    return "[" + ",".join(hex(sum(1 << c for c in r.cpus)) for r in ranks) + "]"


def make_plan(topology: Topology, request: PlanRequest) -> Plan:
    workers = request.ccl_worker_count
    if request.binding not in BINDINGS:
        raise CoreCPUError(f"binding {request.binding!r} is not one of: {', '.join(BINDINGS)}")
    if workers < 0:
        raise CoreCPUError(f"--ccl-workers {workers} is negative; use 0 or more")
    if request.nproc != "auto" and (not isinstance(request.nproc, int) or request.nproc < 1):
        raise CoreCPUError(f"--nproc {request.nproc} is not a positive number; use e.g. --nproc 2 or --nproc auto")
    notes: list[str] = list(topology.source_notes)
    allowed = set(topology.allowed)

    nodes = _select_nodes(topology, request, allowed, notes)
    cores_by_node = {n: [c for c in topology.cores if c.node == n and allowed.intersection(c.cpus)] for n in nodes}
    n_cores = sum(len(v) for v in cores_by_node.values())
    n_cpus = sum(len(allowed.intersection(c.cpus)) for v in cores_by_node.values() for c in v)
    budget = topology.quota_threads

    if request.nproc == "auto":
        nproc = len(nodes)
        if budget is not None and nproc * (1 + workers) > budget:
            nproc = max(1, budget // (1 + workers))
            notes.append(f"--nproc auto: the CPU quota sustains {budget} busy thread(s), so {nproc} rank(s)")
    else:
        nproc = request.nproc

    logical = request.use_logical_cores
    units_by_node = {n: [_Unit(n, tuple(c for c in core.cpus if c in allowed)) for core in cs] for n, cs in cores_by_node.items()}
    if logical and nproc > n_cores:
        # More ranks than cores: each hyperthread becomes a unit and siblings must part.
        units_by_node = {n: [_Unit(n, (c,)) for u in us for c in u.cpus] for n, us in units_by_node.items()}
        notes.append(f"{nproc} ranks > {n_cores} cores: ranks get single hyperthreads, so some share a physical core")
    n_units = sum(len(v) for v in units_by_node.values())

    if nproc > n_units:
        if request.allow_oversubscribe:
            what = f"{n_units} CPU(s)" if logical else f"{n_units} physical core(s)"
            return _oversubscribed(topology, request, nproc, units_by_node, what, n_units, notes)
        if logical:
            raise CoreCPUError(
                f"{nproc} ranks need {nproc} CPUs but this process may use only {n_units} "
                f"({format_cpu_list(sorted(allowed))}); use --nproc {n_units} or fewer, or --oversubscribe to let "
                "ranks share them (1 thread each; slow, for testing)"
            )
        hint = " or --use-logical-cores" if n_cpus > n_cores else ""
        raise CoreCPUError(
            f"{nproc} ranks need {nproc} physical cores but this process may use only {n_cores} "
            f"(CPUs {format_cpu_list(sorted(allowed))}); use --nproc {n_cores} or fewer{hint}, or --oversubscribe "
            "to let ranks share them (1 thread each; slow, for testing)"
        )

    groups = _assign(units_by_node, nproc, notes)
    smallest = min(len(g) for g in groups)
    if workers and workers >= smallest and request.ccl_workers is None:
        # The default gives way: with no core to spare, oneCCL runs collectives in the rank's thread.
        workers = 0
        notes.append(f"no core to spare for a CCL worker ({smallest} per rank): CCL_WORKER_OFFLOAD=0 runs "
                     "collectives in each rank's own thread")
    if workers and workers >= smallest:
        fewer = max(1, n_units // (workers + 1))
        raise CoreCPUError(
            f"--ccl-workers {workers} leaves no compute core: the smallest rank gets {smallest} core(s) "
            f"({n_units} cores for {nproc} ranks); use --ccl-workers {smallest - 1} or --nproc {fewer}"
        )

    trimmed = _apply_quota(groups, workers, logical, budget, request.allow_oversubscribe, notes)
    ranks, worker_siblings = _build_ranks(topology, groups, workers, logical)
    if request.binding == "numa":
        ranks = _widen_to_nodes(topology, ranks, allowed, logical, notes)
    busy = sum(r.omp_num_threads + len(r.ccl_worker_cpus) for r in ranks)
    env = _environment(topology, request, ranks, workers, throttled=budget is not None and busy > budget)
    ranks = _place_comm_threads(topology, ranks, env, notes, budget)
    if request.binding == "numa":
        env["I_MPI_PIN_DOMAIN"] = "numa"  # masks must not overlap; a domain per NUMA node is the same choice
    _explain_idle(topology, request, ranks, allowed, nodes, trimmed, worker_siblings, notes)
    counts = [r.omp_num_threads for r in ranks]
    if len(set(counts)) > 1:
        notes.append(
            f"uneven split: ranks get {','.join(map(str, counts))} threads; DDP steps at the pace of the "
            "slowest rank, so pick --nproc to divide the cores evenly when you can"
        )
    return Plan(topology, request, tuple(ranks), env, tuple(notes))


def _select_nodes(topology: Topology, request: PlanRequest, allowed: set[int], notes: list[str]) -> list[int]:
    with_cpus = [n for n, cpus in topology.nodes if allowed.intersection(cpus)]
    if request.numa_nodes is None:
        chosen = with_cpus
    else:
        for n in request.numa_nodes:
            if n not in topology.node_ids:
                raise CoreCPUError(
                    f"NUMA node {n} does not exist; this machine has nodes {','.join(map(str, topology.node_ids))}"
                )
            if n not in with_cpus:
                raise CoreCPUError(
                    f"NUMA node {n} has no CPUs this process may use (allowed: {format_cpu_list(sorted(allowed))}); "
                    f"pick from nodes {','.join(map(str, with_cpus))}"
                )
        chosen = sorted(set(request.numa_nodes))
    # Nodes of one package first, so a rank that must span nodes spans neighbours.
    package_of = {c.node: c.package for c in topology.cores}
    return sorted(chosen, key=lambda n: (package_of.get(n, 0), n))


def _assign(units_by_node: dict[int, list[_Unit]], nproc: int, notes: list[str]) -> list[list[_Unit]]:
    """Split units into `nproc` groups: whole nodes when ranks are fewer, else node by node."""
    nodes = list(units_by_node)
    if nproc < len(nodes):
        sizes = [len(units_by_node[n]) for n in nodes]
        cuts = _partition(sizes, nproc)
        groups = []
        for i, (a, b) in enumerate(cuts):
            spanned = nodes[a:b]
            groups.append([u for n in spanned for u in units_by_node[n]])
            if len(spanned) > 1:
                notes.append(
                    f"rank {i} spans NUMA nodes {','.join(map(str, spanned))}: {nproc} rank(s) for {len(nodes)} nodes; "
                    f"--nproc {len(nodes)} keeps every rank's memory local"
                )
        return groups
    # Ranks per node, each extra rank to the node whose ranks have the most units.
    share = {n: 1 for n in nodes}
    for _ in range(nproc - len(nodes)):
        candidates = [n for n in nodes if share[n] < len(units_by_node[n])]
        best = max(candidates, key=lambda n: (len(units_by_node[n]) / share[n], -nodes.index(n)))
        share[best] += 1
    groups = []
    for n in nodes:
        units = units_by_node[n]
        q, extra = divmod(len(units), share[n])
        start = 0
        for k in range(share[n]):
            size = q + (1 if k < extra else 0)
            groups.append(units[start:start + size])
            start += size
    return groups


def _partition(sizes: list[int], parts: int) -> list[tuple[int, int]]:
    """Contiguous split of `sizes` into `parts` runs minimising the largest sum (few nodes: brute DP)."""
    n = len(sizes)
    prefix = [0]
    for s in sizes:
        prefix.append(prefix[-1] + s)
    best: dict[tuple[int, int], tuple[int, list[tuple[int, int]]]] = {}

    def solve(start: int, k: int) -> tuple[int, list[tuple[int, int]]]:
        if k == 1:
            return prefix[n] - prefix[start], [(start, n)]
        if (start, k) not in best:
            options = []
            for end in range(start + 1, n - k + 2):
                rest, cuts = solve(end, k - 1)
                options.append((max(prefix[end] - prefix[start], rest), [(start, end)] + cuts))
            best[(start, k)] = min(options, key=lambda o: o[0])
        return best[(start, k)]

    return solve(0, parts)[1]


def _apply_quota(groups: list[list[_Unit]], workers: int, logical: bool, budget: int | None,
                 oversubscribe: bool, notes: list[str]) -> list[int]:
    """Drop compute CPUs until busy threads fit the quota; returns the CPUs dropped."""
    if budget is None:
        return []

    def threads(g: list[_Unit]) -> int:
        compute = g[: len(g) - workers]
        return (sum(len(u.cpus) for u in compute) if logical else len(compute)) + workers

    dropped: list[int] = []
    while sum(threads(g) for g in groups) > budget:
        g = max(groups, key=lambda g: (threads(g) - workers, -groups.index(g)))
        if threads(g) - workers <= 1:
            need = sum(threads(g) for g in groups)
            msg = (f"the cgroup CPU quota sustains {budget} busy thread(s) but {len(groups)} rank(s) need {need} "
                   f"(1 compute + {workers} CCL worker each)")
            if not oversubscribe:
                raise CoreCPUError(f"{msg}; use --nproc {max(1, budget // (1 + workers))} or raise the quota")
            notes.append(f"{msg}: ranks will be throttled")
            break
        last = g[len(g) - workers - 1]
        if logical and len(last.cpus) > 1:
            dropped.append(last.cpus[-1])
            last.cpus = last.cpus[:-1]  # shed the hyperthread before the core
        else:
            dropped.extend(last.cpus)
            del g[len(g) - workers - 1]
    return dropped


def _build_ranks(topology: Topology, groups: list[list[_Unit]], workers: int, logical: bool) -> tuple[list[RankPlan], list[int]]:
    ranks, worker_siblings = [], []
    single_node = len([n for n, cpus in topology.nodes if cpus]) == 1
    for i, g in enumerate(groups):
        compute, worker_units = g[: len(g) - workers], g[len(g) - workers:]
        cpus = tuple(sorted(c for u in compute for c in (u.cpus if logical else u.cpus[:1])))
        worker_cpus = tuple(u.cpus[0] for u in worker_units)
        if logical:
            # A spinning CCL worker would starve a compute thread on its sibling.
            worker_siblings += [c for u in worker_units for c in u.cpus[1:]]
        node_ids = tuple(sorted({u.node for u in g}))
        membind: tuple[str, ...] = ()
        if topology.numactl and len(node_ids) == 1 and not single_node:
            membind = ("numactl", f"--membind={node_ids[0]}")
        ranks.append(RankPlan(i, cpus, node_ids, len(cpus), worker_cpus, membind, len(g)))
    return ranks, worker_siblings


def _place_comm_threads(topology: Topology, ranks: list[RankPlan], env: dict[str, str],
                        notes: list[str], budget: int | None = None) -> list[RankPlan]:
    """Each rank's comm thread (the MPI or shared-memory gradient all-reduce spins on one) gets a free CPU of its
    node where one exists; where none does, MPI's waits must sleep (I_MPI_WAIT_MODE=1) or they take the CPU the
    backward pass is running on. gloo never spins, so the setting is harmless on that path."""
    busy = sum(r.omp_num_threads + len(r.ccl_worker_cpus) for r in ranks) + len(ranks)
    if budget is not None and busy > budget:
        # A free CPU does not help under a CPU quota: one more spinning thread only gets the job throttled.
        if "I_MPI_WAIT_MODE" not in env:
            env["I_MPI_WAIT_MODE"] = "1"
            notes.append(f"{busy} busy threads with comm threads, more than the CPU quota's {budget}: "
                         "I_MPI_WAIT_MODE=1 so MPI waits sleep instead of spin")
        return ranks
    placed = []
    for r in ranks:
        choice = busy_threads.for_rank(topology, ranks, r, r.omp_num_threads, {})
        if choice.wait_mode and "I_MPI_WAIT_MODE" not in env:
            env["I_MPI_WAIT_MODE"] = choice.wait_mode
            notes.append(f"rank {r.local_rank}: {choice.reason}")
        placed.append(dataclasses.replace(r, comm_cpu=choice.cpu))
    if any(r.comm_cpu is not None for r in placed):
        notes.append("comm threads on CPUs nobody computes on: " + ", ".join(
            f"rank {r.local_rank} -> {r.comm_cpu}" for r in placed if r.comm_cpu is not None))
    return placed


def _widen_to_nodes(topology: Topology, ranks: list[RankPlan], allowed: set[int], logical: bool,
                    notes: list[str]) -> list[RankPlan]:
    """numa binding: each rank's affinity becomes every usable CPU of its NUMA node(s), threads unchanged."""
    usable = {c for core in topology.cores for c in (core.cpus if logical else core.cpus[:1]) if c in allowed}
    widened = []
    for r in ranks:
        node_cpus = {c for n, cpus in topology.nodes if n in r.numa_nodes for c in cpus} & usable
        widened.append(RankPlan(r.local_rank, r.cpus, r.numa_nodes, r.omp_num_threads, r.ccl_worker_cpus,
                                r.membind, r.cores, tuple(sorted(node_cpus | set(r.cpus)))))
    notes.append("numa binding: each rank may run on any CPU of its NUMA node, with its own thread count, so "
                 "the scheduler can move it away from another process's busy core")
    return widened


def _environment(topology: Topology, request: PlanRequest, ranks: list[RankPlan], workers: int,
                 throttled: bool = False) -> dict[str, str]:
    env: dict[str, str] = {"I_MPI_PIN_DOMAIN": pin_domain(tuple(ranks))}
    if throttled:
        # Ranks that share CPUs (or a quota): MPI's busy-polling waits steal the CPU from the rank
        # being waited for (measured 3-4x slower than gloo); Intel MPI reads this at MPI_Init.
        env["I_MPI_WAIT_MODE"] = "1"
    if request.backend == "ccl":
        env.update(ccl_environment([r.cpus for r in ranks], [r.ccl_worker_cpus for r in ranks]))
    elif workers:
        env["CCL_WORKER_COUNT"] = str(workers)
        env["CCL_WORKER_AFFINITY"] = ",".join(str(c) for r in ranks for c in r.ccl_worker_cpus)
    libs = topology.libraries
    if request.binding == "numa":
        # OpenMP must not pin each thread to one place: that would undo the freedom the mask gives.
        env["OMP_PROC_BIND"] = "false"
        if libs.iomp5:
            env["KMP_AFFINITY"] = "disabled"
            env["KMP_BLOCKTIME"] = "1"
    elif libs.iomp5:
        env["KMP_AFFINITY"] = KMP_AFFINITY
        env["KMP_BLOCKTIME"] = "1"
    else:
        env["OMP_PROC_BIND"] = "close"
        env["OMP_PLACES"] = "threads" if request.use_logical_cores else "cores"
    preload = [p for p in (chosen_allocator(request.allocator, libs), libs.iomp5) if p]
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    return env


def _explain_idle(topology: Topology, request: PlanRequest, ranks: list[RankPlan], allowed: set[int], nodes: list[int],
                  trimmed: list[int], worker_siblings: list[int], notes: list[str]) -> None:
    used = {c for r in ranks for c in r.cpus + r.ccl_worker_cpus}
    idle = allowed - used
    explained: set[int] = set()

    def say(cpus: set[int] | list[int], why: str) -> None:
        cpus = set(cpus) & idle - explained
        if cpus:
            explained.update(cpus)
            notes.append(f"CPUs {format_cpu_list(cpus)} left idle: {why}")

    outside = {c for n, cpus in topology.nodes if n not in nodes for c in cpus}
    say(outside, "their NUMA nodes are not in --numa-nodes")
    say(trimmed, f"the cgroup CPU quota ({topology.cpu_quota:g} CPUs) sustains only {topology.quota_threads} busy thread(s)"
        if topology.cpu_quota else "CPU quota")
    say(worker_siblings, "hyperthread siblings of CCL worker cores, so compute never shares a core with a spinning worker")
    siblings = {c for core in topology.cores for c in core.cpus[1:]}
    say(siblings, "hyperthread siblings; one compute thread per physical core is faster for "
        "GEMM-heavy training (--use-logical-cores uses them)")
    say(idle, "no rank needed them")


def _oversubscribed(topology: Topology, request: PlanRequest, nproc: int, units_by_node: dict[int, list[_Unit]],
                    what: str, fits: int, notes: list[str]) -> Plan:
    # Primary threads first, then siblings, so ranks fill distinct cores before sharing one.
    order = [u.cpus[0] for us in units_by_node.values() for u in us]
    order += [c for us in units_by_node.values() for u in us for c in u.cpus[1:]]
    # Workers would share the rank's CPU: by default run collectives in the rank's thread instead.
    workers = request.ccl_workers or 0
    single_node = len([n for n, cpus in topology.nodes if cpus]) == 1
    ranks = []
    for i in range(nproc):
        cpu = order[i % len(order)]
        node = topology.node_of(cpu)
        membind = ("numactl", f"--membind={node}") if topology.numactl and not single_node else ()
        # Workers share the rank's CPU: there is no spare core to give them.
        ranks.append(RankPlan(i, (cpu,), (node,), 1, (cpu,) * workers, membind, 0))
    env = _environment(topology, request, ranks, workers, throttled=True)
    del env["I_MPI_PIN_DOMAIN"]  # Intel MPI domains must not overlap; bind pins instead
    warning = (f"oversubscribed: {nproc} ranks for {what}; each rank gets 1 thread and ranks share "
               f"CPUs round-robin, so expect slow steps; use --nproc {fits} or fewer")
    notes.append("I_MPI_PIN_DOMAIN not set: the ranks' CPUs overlap and Intel MPI domains may not")
    if topology.quota_threads is not None and nproc > topology.quota_threads:
        notes.append(f"the cgroup CPU quota ({topology.cpu_quota:g} CPUs) will also throttle these {nproc} ranks")
    return Plan(topology, request, tuple(ranks), env, tuple(notes), (warning,), oversubscribed=True)


# ---------------------------------------------------------------- argparse glue (shared by cli and bind)


def add_request_arguments(parser: argparse.ArgumentParser, *, nproc_help: str | None = None) -> None:
    group = parser.add_argument_group("plan")
    # --nproc-per-node: torchrun's name for the same number (corecpu launch takes both, with this meaning).
    group.add_argument("--nproc", "--nproc-per-node", dest="nproc", default="auto", metavar="N|auto",
                       help=nproc_help or "ranks on this node (default auto: one per NUMA node)")
    group.add_argument("--backend", choices=("gloo", "ccl"), default=None,
                       help="process-group backend; ccl reserves one CCL worker core per rank by default "
                       f"(default: gloo; under corecpu.bind, the launcher's ${envvars.BACKEND})")
    group.add_argument("--ccl-workers", type=int, default=None, metavar="K",
                       help="CCL worker threads per rank, each on one of the rank's cores (default: 1 with ccl, else 0)")
    group.add_argument("--use-logical-cores", action="store_true", help="compute on hyperthread siblings too")
    group.add_argument("--numa-nodes", metavar="LIST", default=None, help="use only these NUMA nodes, e.g. 0 or 0-1")
    group.add_argument("--binding", choices=("auto", *BINDINGS), default=None,
                       help="core: pin each rank to its own cores; numa: let it run on any CPU of its NUMA node; "
                       "auto (default): core, with the evidence of sharing (busy CPUs, exclusive cpuset, "
                       "whole-node Slurm job, Guaranteed pod) given as its reason")
    group.add_argument("--oversubscribe", action="store_true",
                       help="allow more ranks than CPUs (1 thread each, CPUs shared)")


def request_from_args(args: argparse.Namespace) -> PlanRequest:
    nproc: int | Literal["auto"]
    if str(args.nproc).strip().lower() == "auto":
        nproc = "auto"
    else:
        try:
            nproc = int(args.nproc)
        except ValueError:
            raise CoreCPUError(f"--nproc {args.nproc!r} is not a number; use e.g. --nproc 2 or --nproc auto") from None
    try:
        nodes = parse_cpu_list(args.numa_nodes) if args.numa_nodes else None
    except CoreCPUError:
        raise CoreCPUError(f"bad NUMA node list '{args.numa_nodes}'; expected e.g. 0 or 0-1") from None
    return PlanRequest(
        nproc=nproc,
        backend=args.backend or "gloo",
        ccl_workers=args.ccl_workers,
        use_logical_cores=args.use_logical_cores,
        numa_nodes=nodes,
        allow_oversubscribe=args.oversubscribe,
        binding=args.binding if args.binding in BINDINGS else "core",  # auto: the caller resolves it
    )


__all__ = ["BINDINGS", "Plan", "PlanRequest", "RankPlan", "make_plan", "pin_domain", "add_request_arguments", "request_from_args"]
