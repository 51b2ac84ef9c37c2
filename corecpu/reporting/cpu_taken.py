"""How much of each rank's CPUs other processes and the hypervisor took while it trained, and the lines that say so.

Every rank sends, in the log step's all-reduce, three running totals since the loop started (corecpu.cpu
.contention): seconds its CPUs ran other processes, seconds the hypervisor stole from them, and seconds they
counted in all (0 where its CPUs are not watched: shared with another rank, or no /proc/stat). Rank 0 turns them
into each interval's shares for the records and the shares after the first interval (warm-up) for the summary.

The summary's shares decide three things at the end of a run:
  - a straggler line (corecpu.reporting.rank_wait) says what held that rank back, when it was measured;
  - otherwise a rank whose CPUs were taken (contention.TAKEN) gets a line of its own: the run's samples/s is not
    the machine's;
  - such a run's samples/s goes to the rank-count history (`./launch.sh auto`, corecpu.reporting.rank_history)
    with the runs that started beside a busy neighbour, never to be read by an idle start: the launcher's look
    before the ranks start cannot see a neighbour that came later.
"""

from __future__ import annotations

from typing import Sequence

from corecpu.cpu.contention import TAKEN, Taken, shares

# A record's share covers at least this much of a rank's CPU time: /proc/stat counts in 10-ms ticks, and over a
# step or two a tick either way, or the launcher's own proxy waking once, read as 10-50% (a quiet rank's records read
# 0-58% with one-step intervals on a 2-vCPU Xeon). Shorter intervals are added to the next record's.
MIN_COUNTED_S = 0.5


def _shares(now: Sequence[Sequence[float]], before: Sequence[Sequence[float]]) -> list[Taken | None]:
    """Each rank's shares between two gatherings of (others, steal, counted) totals; None where not counted."""
    return [None if counted <= 0 else shares(others - others0, steal - steal0, counted - counted0)
            for (others, steal, counted), (others0, steal0, counted0) in zip(now, before)]


class TakenLog:
    """Every rank's running totals, as each log record gathers them."""

    def __init__(self) -> None:
        self._first: list[tuple[float, float, float]] | None = None
        self._last: list[tuple[float, float, float]] | None = None
        self._told: list[tuple[float, float, float]] | None = None  # each rank's totals when a record last told

    def record(self, others: Sequence[float], steal: Sequence[float], counted: Sequence[float]
               ) -> dict[str, list[float | None]]:
        """The record's "rank_cpu_others" and "rank_cpu_steal": each rank's shares since the last record that gave
        it one (null where its CPUs are not watched, or, after the first record, under MIN_COUNTED_S of their time
        since then). Nothing when no rank's are."""
        now = list(zip(others, steal, counted))
        first, told = self._told is None, self._told or [(0.0, 0.0, 0.0)] * len(now)
        # The first record tells whatever it counted (as a null, under one tick): it holds the loop's warm-up.
        enough = [first or c - c0 >= MIN_COUNTED_S for (_, _, c), (_, _, c0) in zip(now, told)]
        interval = [t if ok else None for t, ok in zip(_shares(now, told), enough)]
        self._told = [n if ok else t for n, t, ok in zip(now, told, enough)]
        self._last = now
        if self._first is None:
            self._first = now
        if all(t is None for t in interval):
            return {}
        return {"rank_cpu_others": [None if t is None else round(t.others, 4) for t in interval],
                "rank_cpu_steal": [None if t is None else round(t.steal, 4) for t in interval]}

    @property
    def window(self) -> list[Taken | None] | None:
        """Each rank's shares since the first record (after warm-up); None before a second record."""
        if self._first is None or self._last is None or self._last is self._first:
            return None
        return _shares(self._last, self._first)

    def summary(self) -> dict[str, list[dict[str, float] | None] | None]:
        window = self.window
        if window is None or all(t is None for t in window):
            return {"rank_cpu_taken_after_warmup": None}
        return {"rank_cpu_taken_after_warmup": [None if t is None else t.rounded() for t in window]}

    def taken(self) -> dict[int, Taken]:
        """The ranks whose CPUs other processes or the hypervisor took at least TAKEN of, after warm-up."""
        return {r: t for r, t in enumerate(self.window or []) if t is not None and max(t.others, t.steal) >= TAKEN}


def cause(t: Taken | None) -> str | None:
    """What held a straggler back, in a clause; None where its CPUs were not watched."""
    if t is None:
        return None
    if t.others >= TAKEN and t.others >= t.steal:
        return (f"other processes used {t.others:.0%} of its CPUs' time"
                + (f" and the hypervisor took {t.steal:.0%} (steal)" if t.steal >= 0.01 else "")
                + ". Free them")
    if t.steal >= TAKEN:
        return (f"the hypervisor gave {t.steal:.0%} of its CPUs' time to other guests (steal), which nothing inside "
                "this machine can free. Ask for dedicated vCPUs")
    return (f"nothing else ran on its CPUs ({t.others:.1%} other processes, {t.steal:.1%} steal), so they are "
            "slower than the others'. Bind the ranks to CPUs of one kind")


def line(taken: dict[int, Taken], cpus: Sequence[str]) -> str | None:
    """The end-of-run line for ranks whose CPUs were taken (when no straggler line said it already)."""
    if not taken:
        return None
    parts = []
    for r, t in sorted(taken.items()):
        where = f" (CPUs {cpus[r]})" if r < len(cpus) and cpus[r] else ""
        what = [f"other processes {t.others:.0%}" if t.others >= 0.01 else "",
                f"the hypervisor {t.steal:.0%} (steal)" if t.steal >= 0.01 else ""]
        parts.append(f"rank {r}{where}: " + " and ".join(w for w in what if w))
    return ("this run shared its CPUs while it trained: " + "; ".join(parts) + " of their time. Its samples/s is "
            "not what this machine does alone: `./launch.sh auto` and the rank-count advice keep it with the runs "
            "that started beside a busy neighbour, apart from idle starts")


__all__ = ["MIN_COUNTED_S", "TakenLog", "cause", "line"]
