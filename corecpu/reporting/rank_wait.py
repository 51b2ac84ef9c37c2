"""How long ranks stood waiting for each other, and which rank they waited for.

Synchronous data parallelism steps every rank at the pace of the slowest. With the optimizer sharded through
shared memory (corecpu.distributed.shared_adamw) each rank counts the seconds it spent in the step's barriers;
over an interval, those seconds over the interval's wall time are the share of the rank's time lost to lockstep.
For two ranks, the mean of the two shares is the share of the job's time that lockstep takes: each step the
faster rank waits |t0 - t1| while the step lasts max(t0, t1) = mean + |t0 - t1| / 2.

Measured on a 2-vCPU EPYC (Zen 3, KVM) with benchmarks/lockstep_jitter.py, two ranks stepping MiniLM in
lockstep with no gradient exchanged: their step times differed by 13-14% (sd of the log ratio) from step to step,
with a lag-1 autocorrelation of 0.2-0.25 and none beyond, so the faster rank cannot be given more of the batch
ahead of time (a split following an average of past ratios won nothing); lockstep cost 4.6-5.4%. corecpu's
2-rank runs there read `wait` 5-7%. A share that is large on every rank but one names a straggler: something
else running on that rank's CPUs, the hypervisor giving them away, or slower CPUs (corecpu.reporting.cpu_taken
says which, from each rank's /proc/stat counters).
"""

from __future__ import annotations

from typing import Callable, Sequence

# A straggler is named when, over at least STRAGGLER_INTERVALS log intervals after the first, the other ranks lost
# at least this share of their time waiting (jitter alone: up to 20% a rank over one 10-step interval, 5-9% over
# whole runs, on the Zen 3 above)...
STRAGGLER_WAIT = 0.15
# ...and it waited at most this fraction of what each of them did (jitter makes every rank wait about alike;
# two slow ranks make a third wait for both, and each of the two little).
STRAGGLER_RATIO = 0.25
STRAGGLER_INTERVALS = 3


def shares(waited_now: Sequence[float], waited_before: Sequence[float], seconds: float) -> list[float]:
    """Every rank's share of `seconds` spent waiting, from its cumulative waits at both ends of the interval."""
    if seconds <= 0:
        return [0.0 for _ in waited_now]
    return [min(max((now - before) / seconds, 0.0), 1.0) for now, before in zip(waited_now, waited_before)]


def straggler(rank_shares: Sequence[float]) -> int | None:
    """The rank every other rank waited for, if one stands out; None when the waits look like jitter."""
    if len(rank_shares) < 2:
        return None
    slow = min(range(len(rank_shares)), key=lambda r: rank_shares[r])
    others = [s for r, s in enumerate(rank_shares) if r != slow]
    if _mean_of_others(rank_shares, slow) >= STRAGGLER_WAIT and rank_shares[slow] <= STRAGGLER_RATIO * min(others):
        return slow
    return None


def _mean_of_others(rank_shares: Sequence[float], rank: int) -> float:
    return sum(s for r, s in enumerate(rank_shares) if r != rank) / (len(rank_shares) - 1)


class WaitLog:
    """Every rank's cumulative waits, as each log record gathers them, into the record's shares (since the last
    record) and the summary's (since the first record: the first interval is warm-up, as for samples/s)."""

    def __init__(self, started: float) -> None:
        self._last: tuple[float, list[float]] | None = None  # (when, every rank's seconds so far) at the last record
        self._first: tuple[float, list[float]] | None = None  # the same at the first record
        self._started = started
        self.intervals = 0  # log intervals since the first record

    @property
    def window(self) -> list[float] | None:
        """Each rank's share of the time since the first record spent waiting; None before a second record."""
        if self._first is None or self._last is None or self._last[0] <= self._first[0]:
            return None
        return shares(self._last[1], self._first[1], self._last[0] - self._first[0])

    def record(self, now: float, waited: Sequence[float]) -> dict[str, float | list[float]]:
        """`waited`: every rank's seconds so far. The record's "wait" (the ranks' mean share: what lockstep cost)
        and "rank_wait" (each rank's)."""
        since, before = self._last or (self._started, [0.0] * len(waited))
        interval = shares(waited, before, now - since)
        self._last = (now, list(waited))
        if self._first is None:
            self._first = self._last
        elif now > self._first[0]:
            self.intervals += 1
        return {"wait": round(sum(interval) / len(interval), 4), "rank_wait": [round(v, 4) for v in interval]}

    def summary(self) -> dict[str, float | list[float] | None]:
        window = self.window
        return {"wait_after_warmup": round(sum(window) / len(window), 4) if window else None,
                "rank_wait_after_warmup": [round(v, 4) for v in window] if window else None}

    def straggler(self) -> int | None:
        """The rank the others waited for after warm-up, once the window is long enough to tell one from jitter."""
        window = self.window
        if window is None or self.intervals < STRAGGLER_INTERVALS:
            return None
        return straggler(window)

    def straggler_line(self, cpus: Sequence[str], cause: Callable[[int], str | None] = lambda rank: None
                       ) -> str | None:
        """The end-of-run line naming a straggler; `cause(rank)`: what held it back, when that was measured."""
        slow, window = self.straggler(), self.window
        return None if slow is None or window is None else straggler_line(window, cpus, cause(slow))


def straggler_line(rank_shares: Sequence[float], cpus: Sequence[str], cause: str | None = None) -> str | None:
    """One line for the end of a run whose ranks kept waiting for one of them; `cpus`: each rank's CPU list;
    `cause`: what held it back (corecpu.reporting.cpu_taken.cause), ending where the advice on freeing it may."""
    slow = straggler(rank_shares)
    if slow is None:
        return None
    mean = _mean_of_others(rank_shares, slow)
    where = f" (CPUs {cpus[slow]})" if slow < len(cpus) and cpus[slow] else ""
    why = cause or "something else runs on its CPUs, or they are slower. Free them"
    return (f"rank {slow}{where} was the slow one: the other ranks spent {mean:.0%} of the training time waiting "
            f"for it; {why}, or run fewer ranks (`./launch.sh auto` picks the rank count by measuring)")


__all__ = ["STRAGGLER_INTERVALS", "STRAGGLER_RATIO", "STRAGGLER_WAIT", "WaitLog", "shares", "straggler",
           "straggler_line"]
