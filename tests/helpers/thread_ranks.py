"""Ranks as threads of one process, for units that take a barrier and a scalar sum instead of a process group."""

from __future__ import annotations

import threading


class Group:
    """What N ranks need of a process group, for N threads."""

    def __init__(self, n: int) -> None:
        self._wait = threading.Barrier(n, timeout=60).wait
        self._values = [0.0] * n

    def barrier(self) -> None:
        self._wait()

    def sum_scalar(self, rank: int, x: float) -> float:
        self._values[rank] = x
        self._wait()
        total = sum(self._values)
        self._wait()
        return total

    def abort(self) -> None:
        """Wake every waiting thread with BrokenBarrierError (a rank failed)."""
        self._wait.__self__.abort()  # type: ignore[attr-defined]
