"""Every thread a rank keeps busy, and what to do when they outnumber its CPUs.

A rank runs its OpenMP compute threads and, with the MPI or shared-memory gradient path, one comm
thread that spins while a bucket waits for the other ranks (Intel MPI polls by default). The rest
wait without using a CPU: corecpu's heartbeat, watchdog, stop-signal, launcher-watch and output-lock
threads sleep between checks, and gloo's threads block on sockets. When busy threads outnumber the rank's CPUs, the spinning comm
thread takes CPU time from the backward pass it is meant to overlap with. Two fixes, in order:
  1. a CPU nobody computes on (a hyperthread sibling or a core the plan left idle) on the rank's NUMA
     node: the comm thread runs there and keeps spinning, which is the fastest way to wait;
  2. otherwise Intel MPI's wait mode (I_MPI_WAIT_MODE=1, read at MPI_Init): waits block instead.
A user's own I_MPI_WAIT_MODE is kept either way.

`plan_comm_thread` is pure; `free_cpus_for` reads the node plan it is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from corecpu.cpu.cpulist import format_cpu_list
from corecpu.cpu.rank_placement import RankPlan
from corecpu.cpu.topology import Topology

WAIT_MODE_VAR = "I_MPI_WAIT_MODE"


@dataclass(frozen=True)
class CommThreadPlan:
    wait_mode: str | None  # the I_MPI_WAIT_MODE value to set before MPI_Init; None: leave it
    cpu: int | None  # a CPU of its own for the comm thread, when one is free
    reason: str


def plan_comm_thread(compute_threads: int, rank_cpus: Sequence[int], free_cpus: Sequence[int],
                     env: Mapping[str, str], spinning: int = 1) -> CommThreadPlan:
    """Pure. `rank_cpus`: the CPUs this rank computes on; `free_cpus`: CPUs of its node no rank computes on
    (already shared out between the node's ranks); `spinning`: threads that poll while waiting (the comm thread)."""
    busy = compute_threads + spinning
    count = f"{busy} busy threads ({compute_threads} compute + {spinning} comm) on {len(rank_cpus)} CPU(s)"
    if WAIT_MODE_VAR in env:
        return CommThreadPlan(None, free_cpus[0] if free_cpus else None,
                              f"{count}; {WAIT_MODE_VAR}={env[WAIT_MODE_VAR]} set by the user")
    if busy <= len(rank_cpus):
        return CommThreadPlan(None, None, f"{count}: they fit, the comm thread spins")
    if free_cpus:
        return CommThreadPlan(None, free_cpus[0], f"{count}: the comm thread spins on free CPU {free_cpus[0]}")
    return CommThreadPlan("1", None, f"{count}, no CPU free: {WAIT_MODE_VAR}=1 so MPI waits sleep instead of spin")


def free_cpus_for(rank: int, rank_cpus: Sequence[Sequence[int]], node_cpus: Sequence[int]) -> tuple[int, ...]:
    """Pure: the CPUs of `node_cpus` no rank computes on, dealt out round-robin so ranks never share one.
    `rank_cpus[i]` is local rank i's compute CPUs (all ranks of the node)."""
    used = {c for cpus in rank_cpus for c in cpus}
    spare = [c for c in node_cpus if c not in used]
    return tuple(spare[rank::len(rank_cpus)]) if rank_cpus else ()


def describe(plan: CommThreadPlan) -> str:
    where = f" on CPU {format_cpu_list([plan.cpu])}" if plan.cpu is not None else ""
    return f"comm thread{where}: {plan.reason}"


def for_rank(topology: Topology, ranks: Sequence[RankPlan], rank: RankPlan, compute_threads: int,
             env: Mapping[str, str]) -> CommThreadPlan:
    """plan_comm_thread for `rank` among this node's `ranks`: free CPUs are those of its NUMA node(s) that no rank
    computes on and no CCL worker holds, shared out among the ranks on the same node(s)."""
    peers = [r for r in ranks if r.numa_nodes == rank.numa_nodes]
    allowed = set(topology.allowed) - {c for r in ranks for c in r.ccl_worker_cpus}
    node_cpus = [c for n, cpus in topology.nodes if n in rank.numa_nodes for c in cpus if c in allowed]
    busy_elsewhere = [r.cpus for r in ranks if r not in peers]
    free = free_cpus_for(peers.index(rank), [r.cpus for r in peers],
                         [c for c in node_cpus if not any(c in cpus for cpus in busy_elsewhere)])
    return plan_comm_thread(compute_threads, rank.cpus, free, env)


__all__ = ["CommThreadPlan", "WAIT_MODE_VAR", "describe", "for_rank", "free_cpus_for", "plan_comm_thread"]
