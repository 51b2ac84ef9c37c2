"""A barrier, a scalar sum and an agreement on a flag for the ranks of one host, through shared memory.

The shared optimizer step (shared_adamw) waits for the other ranks three or four times a step; over gloo each
wait costs about 0.3 ms even when the ranks arrive together (2-vCPU EPYC, loopback TCP), here a few microseconds.
Each rank writes a generation counter and waits until every counter has reached it: a short spin (the ranks
usually arrive within microseconds of each other), then yielding the CPU, then short sleeps, so a rank that waits
long (its peer evaluating, or sharing a core with it) costs the machine little.

The loop's question between two steps, "did any rank get a stop signal?", is asked here too when the step is
shared (`agree_max`): over gloo that one-int all-reduce took 0.4-6.4 ms right after the step's last barrier,
on both ranks alike, where the same all-reduce asked again at once took 0.2 ms (2-vCPU Xeon, KVM); 3-4 ms of a
120-ms step of short sentences. So are the loop's other sums of a few numbers (`sum_all`: a log step's loss and
counts, a language model's label tokens before each step, an evaluation's counts): over gloo ten float64s took
3.8 ms a call on both ranks between 20-ms computations (2-vCPU Zen 4, KVM), 4.2 ms of a 180-ms step logged
every step.

Each rank also counts the seconds it spent waiting here (`waited_s`): what stepping in lockstep with slower ranks
cost it. The step line and summary.json report it (corecpu.reporting.rank_wait).

Plain loads and stores order correctly only where stores are seen in program order (x86-64's TSO): the data a
rank wrote before its counter is visible to whoever sees the counter. `usable()` says where that holds.
"""

from __future__ import annotations

import os
import platform
import time
from typing import Callable, Sequence

import torch

from corecpu.atomic import pid_alive
from corecpu.errors import CoreCPUError

_SPINS = 200  # about 100 us of checking before yielding the CPU
_YIELDS = 2000  # then about 2 ms of sched_yield before sleeping
_SLEEP_S = 1e-4
_CHECK_PEERS_S = 1.0  # how often a long wait checks that every rank still runs
SUM_SLOTS = 64  # the numbers one sum_all() carries from each rank; longer lists go through the process group


def usable() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


class ShmSync:
    """One rank's side. `counters` (int64) and `values` (float64) hold one slot per rank, `pids` each rank's
    process id, `flags` (int64, optional) two slots per rank, `sums` (float64, optional) two sets of SUM_SLOTS per
    rank; all are shared by every rank of the host and start at zero (`pids` filled by each rank)."""

    def __init__(self, counters: torch.Tensor, values: torch.Tensor, pids: torch.Tensor, *, rank: int,
                 timeout_s: float, alive: Callable[[int], bool] | None = None,
                 flags: torch.Tensor | None = None, sums: torch.Tensor | None = None) -> None:
        self._counters, self._values, self._pids = counters.numpy(), values.numpy(), pids.numpy()
        self._flags = flags.numpy().reshape(2, -1) if flags is not None else None
        self._sums = sums.numpy().reshape(2, len(self._counters), SUM_SLOTS) if sums is not None else None
        self._agreements = self._summed = 0
        self.rank, self.timeout_s = rank, timeout_s
        self._generation = int(self._counters[rank])
        self._alive = alive or pid_alive
        self._pids[rank] = os.getpid()
        self.waited_s = 0.0  # in barrier(), past the first check: time this rank stood waiting for the others

    def barrier(self) -> None:
        """Wait until every rank has called this as many times as this rank has."""
        self._generation += 1
        generation = self._generation
        self._counters[self.rank] = generation
        if self._counters.min() >= generation:
            return
        started = time.monotonic()
        try:
            self._wait(generation, started)
        finally:
            self.waited_s += time.monotonic() - started

    def _wait(self, generation: int, started: float) -> None:
        tries, checked = 0, started
        while self._counters.min() < generation:
            tries += 1
            if tries <= _SPINS:
                continue
            if tries <= _SPINS + _YIELDS:
                os.sched_yield()
                continue
            time.sleep(_SLEEP_S)
            now = time.monotonic()
            if now - checked >= _CHECK_PEERS_S:
                checked = now
                self._check_peers(generation, now - started)

    def sum(self, x: float) -> float:
        """`x` summed over the ranks (the same float on every rank: one order of addition)."""
        self._values[self.rank] = x
        self.barrier()
        return float(self._values.sum())

    def agree_max(self, x: int) -> int:
        """The largest `x` any rank passed (the same int on every rank). Needs `flags`. Two sets of slots, used in
        turn: a rank can write this call's before a slower rank has read the last call's (it has passed the last
        barrier), but not before that rank has read the call before (it would have to pass this barrier)."""
        if self._flags is None:
            raise CoreCPUError("ShmSync.agree_max needs the flags buffer")
        flags = self._flags[self._agreements % 2]
        self._agreements += 1
        flags[self.rank] = x
        self.barrier()
        return int(flags.max())

    def sum_all(self, values: Sequence[float]) -> list[float]:
        """`values` summed element-wise over the ranks: the same floats on every rank (one order of addition).
        At most SUM_SLOTS numbers; needs `sums`. Its two sets of slots are used in turn, as agree_max's are."""
        if self._sums is None or len(values) > SUM_SLOTS:
            raise CoreCPUError(f"ShmSync.sum_all needs the sums buffer and at most {SUM_SLOTS} numbers "
                               f"(got {len(values)})")
        slots = self._sums[self._summed % 2]
        self._summed += 1
        n = len(values)
        slots[self.rank, :n] = values
        self.barrier()
        return slots[:, :n].sum(axis=0).tolist()

    def _check_peers(self, generation: int, waited: float) -> None:
        behind = [r for r in range(len(self._counters)) if self._counters[r] < generation]
        for r in behind:
            pid = int(self._pids[r])
            if pid and not self._alive(pid):
                raise CoreCPUError(f"rank {r} (pid {pid}) ended while the other ranks waited for it (their "
                                   "shared-memory sync); see its output for why")
        if waited > self.timeout_s:
            raise CoreCPUError(f"ranks {behind} did not reach the ranks' shared-memory sync within "
                               f"{self.timeout_s:g} s; a rank is stuck or far slower than the others")


__all__ = ["SUM_SLOTS", "ShmSync", "usable"]
