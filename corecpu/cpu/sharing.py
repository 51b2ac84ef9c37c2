"""Are this job's CPUs its own? The evidence, and the binding chosen with it.

Signs that the CPUs are the job's alone:
  - an exclusive cpuset (cgroup v2 partition root/isolated, v1 cpuset.cpu_exclusive);
  - Slurm gave the job every CPU of the node (as --exclusive does);
  - a Kubernetes pod in the Guaranteed QoS class (the static CPU manager gives it whole cores);
  - every allowed CPU idle when the launcher measured just before starting the ranks.
A CPU measured busy says the opposite: something else is running there now.

The expectation was that a shared node wants a looser binding (each rank free to move within its
NUMA node, `numa`), so that a neighbour landing on one rank's core cannot halve that rank and,
through DDP's lockstep, the job. Measured on a 2-vCPU Xeon with one busy neighbour it was not so:
per-core pinning was as fast or faster (benchmarks/README.md, "Binding on a shared node"), and
quiet runs were equal. So `auto` pins per core whatever the evidence says, and records the
evidence and the reason in config.json; `numa` stays a choice (`--binding numa`) for nodes where a
rank's NUMA node has idle cores to move to, which this machine could not test.

Pure functions take what was read; the readers take paths so tests hand in fake trees.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from corecpu.cpu.cgroups import REAL_CGROUP, _cgroup_dirs, read_file
from corecpu.cpu.contention import busy_ticks, cpu_ticks
from corecpu.cpu.cpulist import format_cpu_list
from corecpu.errors import CoreCPUError

BINDING_CHOICES = ("auto", "core", "numa")
BUSY_FRACTION = 0.5  # a CPU more than half busy with other work over the sample counts as taken
# /proc/stat counts in 10 ms ticks: 0.1 s gives each CPU 10, and a neighbour worth avoiding (a busy loop, another
# job's ranks) fills 9-11 of them while an idle CPU shows 0-1. The launch waits this long before any rank starts.
SAMPLE_SECONDS = 0.1


@dataclass(frozen=True)
class SharingEvidence:
    exclusive: tuple[str, ...] = ()  # signs the CPUs are the job's alone, in words
    busy_cpus: tuple[int, ...] = ()  # allowed CPUs found busy with other work at start
    measured: bool = False  # whether the launcher sampled CPU load before starting the ranks
    notes: tuple[str, ...] = field(default_factory=tuple)


def decide_binding(requested: str, evidence: SharingEvidence) -> tuple[str, str]:
    """Pure: ("core" | "numa", why). auto is core, with the evidence in the reason (see the module's note)."""
    if requested not in BINDING_CHOICES:
        raise CoreCPUError(f"--binding {requested!r} is not one of: {', '.join(BINDING_CHOICES)}")
    if requested != "auto":
        return requested, "requested"
    if evidence.busy_cpus:
        return "core", (f"CPU(s) {format_cpu_list(evidence.busy_cpus)} busy with other work at start; per-core "
                        "pinning measured no slower than numa under a busy neighbour")
    if evidence.exclusive:
        return "core", "CPUs are the job's alone: " + "; ".join(evidence.exclusive)
    if evidence.measured:
        return "core", "every allowed CPU idle at start"
    return "core", "no sign of sharing measured (launch.sh measures at start)"


# ---------------------------------------------------------------- signs (pure)


def slurm_whole_node(env: Mapping[str, str], node_cpus: int) -> str | None:
    """Slurm allocated this node's every CPU to the job (what --exclusive gives)."""
    if not env.get("SLURM_JOB_ID"):
        return None
    # SLURM_JOB_CPUS_PER_NODE: "64", "64(x2)" or "64,32(x3)"; the first entry is the first node's, and a
    # job with --exclusive gets the whole node everywhere.
    first = env.get("SLURM_JOB_CPUS_PER_NODE", "").split(",")[0].split("(")[0]
    if first.isdigit() and node_cpus > 0 and int(first) >= node_cpus:
        return f"Slurm job {env['SLURM_JOB_ID']} holds all {node_cpus} CPUs of this node"
    return None


def kubernetes_guaranteed(proc_self_cgroup_text: str) -> str | None:
    """The pod's cgroup path says Guaranteed QoS: under kubepods, in neither the burstable nor besteffort tier."""
    paths = [line.split(":", 2)[-1] for line in proc_self_cgroup_text.splitlines() if line.count(":") >= 2]
    pod = [p for p in paths if "kubepods" in p]
    if pod and not any(tier in p for p in pod for tier in ("burstable", "besteffort")):
        return "Kubernetes pod in the Guaranteed QoS class"
    return None


def busy_cpus(before: Mapping[int, tuple[int, int]], after: Mapping[int, tuple[int, int]],
              allowed: Sequence[int], threshold: float = BUSY_FRACTION) -> tuple[int, ...]:
    """CPUs of `allowed` busier than `threshold` between two /proc/stat samples of (busy, total) jiffies."""
    busy = []
    for cpu in allowed:
        if cpu in before and cpu in after:
            d_busy, d_total = after[cpu][0] - before[cpu][0], after[cpu][1] - before[cpu][1]
            if d_total > 0 and d_busy / d_total > threshold:
                busy.append(cpu)
    return tuple(busy)


def parse_proc_stat(text: str) -> dict[int, tuple[int, int]]:
    """{cpu: (busy jiffies, total jiffies)} from /proc/stat's cpuN lines. Idle and iowait are not busy, and
    neither is `nice`: time of processes at a positive niceness, which give way to a rank at once (a nice 19
    loop gets about 1.5% of a CPU beside a nice 0 one under CFS), so they are no contention. Counting them
    made a `nice 19` neighbour look like a busy node (issue 29)."""
    return {cpu: (busy_ticks(ticks), sum(ticks)) for cpu, ticks in cpu_ticks(text).items()}


# ---------------------------------------------------------------- readers (I/O)


def cpuset_exclusive(cgroup_root: str | Path = REAL_CGROUP, proc_self_cgroup: str | Path = "/proc/self/cgroup") -> str | None:
    # The hierarchy's root (the last dir) always reads as exclusive: it is the whole machine, not this job's.
    for d in _cgroup_dirs(Path(cgroup_root), proc_self_cgroup, "cpuset")[:-1]:
        partition = (read_file(d / "cpuset.cpus.partition") or "").split()
        if partition and partition[0] in ("root", "isolated"):
            return f"exclusive cpuset (cgroup partition {partition[0]})"
        if (read_file(d / "cpuset.cpu_exclusive") or "").strip() == "1":
            return "exclusive cpuset (cpuset.cpu_exclusive)"
    return None


def measure_busy(allowed: Sequence[int], seconds: float = SAMPLE_SECONDS, proc_stat: str | Path = "/proc/stat",
                 sleep: Callable[[float], None] = time.sleep) -> tuple[int, ...]:
    """Sample /proc/stat twice `seconds` apart; the allowed CPUs that were mostly busy meanwhile.
    Call it before starting the ranks: their own start-up would count as busy."""
    before = parse_proc_stat(read_file(Path(proc_stat)) or "")
    sleep(seconds)
    after = parse_proc_stat(read_file(Path(proc_stat)) or "")
    return busy_cpus(before, after, allowed)


def gather_evidence(env: Mapping[str, str], allowed: Sequence[int], node_cpus: int, *, measure: bool,
                    cgroup_root: str | Path = REAL_CGROUP, proc_self_cgroup: str | Path = "/proc/self/cgroup",
                    proc_stat: str | Path = "/proc/stat") -> SharingEvidence:
    signs = [s for s in (cpuset_exclusive(cgroup_root, proc_self_cgroup), slurm_whole_node(env, node_cpus),
                         kubernetes_guaranteed(read_file(Path(proc_self_cgroup)) or "")) if s]
    busy = measure_busy(allowed, proc_stat=proc_stat) if measure else ()
    return SharingEvidence(tuple(signs), busy, measure)


__all__ = ["BINDING_CHOICES", "SharingEvidence", "busy_cpus", "cpuset_exclusive", "decide_binding", "gather_evidence",
           "kubernetes_guaranteed", "measure_busy", "parse_proc_stat", "slurm_whole_node"]
