"""What else used a rank's CPUs while it trained: other processes, and the hypervisor (steal).

Start-up looks once, for 0.1 s before any rank runs (corecpu.cpu.sharing). A neighbour that starts later, or a
host that hands the vCPUs to other guests, shows only as a slow run, and a slow run's samples/s would then teach
`./launch.sh auto` the wrong rank count. So each rank also reads, at every log record, its CPUs' counters in
/proc/stat and its own CPU time:

  others  the share of its CPUs' time spent running anything but this rank at nice 0 or below (user, system,
          irq, softirq, less this process's own CPU time): another job, a build, a runaway process;
  steal   the share the hypervisor gave to other guests while these vCPUs had work (/proc/stat's steal).

Processes at a positive niceness are left out, as at start-up: they give way to a rank at once (unless the rank
itself was started with `nice`: then they are its equals, and count). On a 2-vCPU EPYC
(Zen 3, KVM) steal was 0.1% over a 170-s run whose two ranks' step times still differed by 14% from step to
step (benchmarks/lockstep_jitter.py): that host's jitter is the vCPUs' speed, not time taken from them.

Pure functions take what was read; `sample()` does the reading.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

# A rank's CPUs counted as taken from it when others or steal reach this share of their time after warm-up: a
# quiet 2-vCPU host reads 0-1% of each, a busy loop on one rank's only CPU about 50% of it.
TAKEN = 0.10


@dataclass(frozen=True)
class CpuTimes:
    """Seconds summed over a set of CPUs since boot, and this process's CPU time, at one moment."""

    busy: float  # user + system + irq + softirq + steal: running something at nice <= 0, or stolen
    steal: float
    total: float  # every second the CPUs counted, idle included
    own: float  # this process's CPU time (every thread)


@dataclass(frozen=True)
class Taken:
    """Over an interval, the shares of a rank's CPU time that went elsewhere (see the module docstring)."""

    others: float
    steal: float

    def rounded(self) -> dict[str, float]:
        return {"others": round(self.others, 4), "steal": round(self.steal, 4)}


def cpu_ticks(text: str) -> dict[int, tuple[int, ...]]:
    """{cpu: its counters} from /proc/stat's cpuN lines: user, nice, system, idle, iowait, irq, softirq, steal, in
    ticks (0 where an older kernel lists fewer). The one reader of that format (corecpu.cpu.sharing uses it too)."""
    out: dict[int, tuple[int, ...]] = {}
    for line in text.splitlines():
        if not line.startswith("cpu"):
            break  # the CPU lines come first; the rest (intr: one count per interrupt) is long on big machines
        name, *fields = line.split()
        if name[3:].isdigit() and len(fields) >= 5:
            ticks = [int(f) for f in fields[:8]]
            out[int(name[3:])] = tuple(ticks + [0] * (8 - len(ticks)))
    return out


def busy_ticks(ticks: Sequence[int], niced: bool = False) -> int:
    """A CPU's ticks spent running something, or stolen: all but idle and iowait, and but `nice` (processes at a
    positive niceness give way to a rank at once) unless `niced`."""
    return sum(ticks) - ticks[3] - ticks[4] - (0 if niced else ticks[1])


def parse(text: str, cpus: Iterable[int], ticks_per_s: float, niced: bool = False
          ) -> tuple[float, float, float] | None:
    """(busy, steal, total) seconds over `cpus` from /proc/stat's text; None when a CPU's line is missing.
    `niced`: this process runs at a positive niceness, so its own time is in the `nice` column, and other
    processes there compete with it on equal terms: busy includes that column."""
    wanted, every = set(cpus), cpu_ticks(text)
    if not wanted or not wanted <= every.keys():
        return None
    got = [every[c] for c in wanted]
    busy, steal, total = (sum(busy_ticks(t, niced) for t in got), sum(t[7] for t in got), sum(sum(t) for t in got))
    return busy / ticks_per_s, steal / ticks_per_s, total / ticks_per_s


def elsewhere(before: CpuTimes, after: CpuTimes) -> tuple[float, float, float]:
    """Between two samples of the same CPUs: seconds other processes ran on them, seconds the hypervisor stole,
    seconds they counted. busy includes steal and this process's own time: what is left ran someone else."""
    steal = after.steal - before.steal
    return (after.busy - before.busy) - steal - (after.own - before.own), steal, after.total - before.total


def shares(others: float, steal: float, counted: float) -> Taken | None:
    """elsewhere()'s seconds as shares of the counted time; None where nothing was counted. /proc/stat counts in
    ticks and the process clock does not, so a quiet interval can read a tick below zero: clamped."""
    if counted <= 0:
        return None
    return Taken(others=min(max(others / counted, 0.0), 1.0), steal=min(max(steal / counted, 0.0), 1.0))


def taken(before: CpuTimes, after: CpuTimes) -> Taken | None:
    """What went elsewhere between two samples of the same CPUs; None over an interval too short to tell."""
    return shares(*elsewhere(before, after))


def sample(cpus: Sequence[int], proc_stat: str | Path = "/proc/stat",
           own: Callable[[], float] = time.process_time, niceness: Callable[[], int] = lambda: os.nice(0)
           ) -> CpuTimes | None:
    """`cpus`' counters now; None where /proc/stat cannot be read (not Linux) or lacks one of them."""
    try:
        text = Path(proc_stat).read_text()
        ticks_per_s = float(os.sysconf("SC_CLK_TCK"))
        niced = niceness() > 0
    except (OSError, ValueError, AttributeError):
        return None
    read = parse(text, cpus, ticks_per_s, niced)
    if read is None:
        return None
    return CpuTimes(*read, own=own())


def watched_cpus(rank: int, ranks: Sequence[Mapping[str, Any]]) -> list[int]:
    """Pure: the CPUs to watch for `rank`, from every rank's "host" and "cpus" (topology.json's entries). Empty
    (nothing watched) where another rank of its host runs on some of them: its time would read as "others"."""
    me = ranks[rank] if 0 <= rank < len(ranks) else {}
    cpus = set(me.get("cpus") or ())
    for r, other in enumerate(ranks):
        if r != rank and other.get("host") == me.get("host") and cpus & set(other.get("cpus") or ()):
            return []
    return sorted(cpus)


__all__ = ["TAKEN", "CpuTimes", "Taken", "busy_ticks", "cpu_ticks", "elsewhere", "parse", "sample", "shares", "taken", "watched_cpus"]
