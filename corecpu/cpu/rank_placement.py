"""One local rank's share of a node plan: its compute CPUs, NUMA node(s), threads and helpers' CPUs.

Its own module so that both the planner (corecpu.cpu.placement) and the rule for the rank's busy threads
(corecpu.cpu.busy_threads, which the planner calls) can name it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from corecpu.cpu.cpulist import format_cpu_list


@dataclass(frozen=True)
class RankPlan:
    local_rank: int
    cpus: tuple[int, ...]  # compute CPUs: the affinity mask and OMP places
    numa_nodes: tuple[int, ...]
    omp_num_threads: int
    ccl_worker_cpus: tuple[int, ...] = ()
    membind: tuple[str, ...] = ()  # command prefix, e.g. ("numactl", "--membind=0")
    cores: int = 0  # physical cores owned, CCL worker cores included
    affinity: tuple[int, ...] = ()  # CPUs the rank may run on, when wider than `cpus` (numa binding)
    comm_cpu: int | None = None  # a CPU no rank computes on, for the gradient all-reduce's spinning comm thread

    @property
    def pin_cpus(self) -> tuple[int, ...]:
        """The affinity mask to set: `cpus`, or the wider set a numa binding allows."""
        return self.affinity or self.cpus

    @property
    def numa_node(self) -> int | list[int]:
        return self.numa_nodes[0] if len(self.numa_nodes) == 1 else list(self.numa_nodes)

    @property
    def cpulist(self) -> str:
        return format_cpu_list(self.cpus)


__all__ = ["RankPlan"]
