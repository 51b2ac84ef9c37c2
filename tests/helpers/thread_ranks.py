"""Ranks as threads of one process, for units that take a barrier and a scalar sum instead of a process group."""

from __future__ import annotations

import threading
from typing import Callable


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


def run_ranks(world: int, group: Group, body: Callable[[int], object]) -> list[object]:
    """`body(rank)` on a thread per rank; what each returned, in rank order. The first error is raised here, after
    waking every other rank from its barrier."""
    out: list[object] = [None] * world
    errors: list[BaseException] = []

    def target(rank: int) -> None:
        try:
            out[rank] = body(rank)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)
            group.abort()

    threads = [threading.Thread(target=target, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return out
