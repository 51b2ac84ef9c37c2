"""Where the loop is and how its time splits: the step being performed, the watchdog that times the
steps, and the seconds spent in phases no step predicts (evaluation, checkpoint writes).

The run's `Steps` is the only writer of the step and the only one that starts the watchdog;
`untimed()` is how evaluation and the checkpointer pause it. The reporter reads the split.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterator

from corecpu.reliability import watchdog as _watchdog


class LoopClock:
    def __init__(self, start_watchdog: Callable[[], "_watchdog.Watchdog | _watchdog.NullWatchdog"]) -> None:
        self._start_watchdog = start_watchdog
        self._watchdog: _watchdog.Watchdog | _watchdog.NullWatchdog | None = None
        self._step = 0  # the optimizer step the loop body performs (0 outside the loop)
        self._untimed: dict[str, float] = {}

    @property
    def step(self) -> int:
        return self._step

    def watchdog(self) -> "_watchdog.Watchdog | _watchdog.NullWatchdog":
        """Started on first use (by the steps' loop), then the same one."""
        if self._watchdog is None:
            self._watchdog = self._start_watchdog()
        return self._watchdog

    def begin_step(self, number: int) -> None:
        self._step = number

    def step_done(self, number: int) -> None:
        if self._watchdog is not None:
            self._watchdog.progress(number)

    @contextlib.contextmanager
    def untimed(self, phase: str, kind: str = "other") -> Iterator[None]:
        """A phase no step predicts: the watchdog does not time it, but a rank that stops during it (its
        heartbeat stands still) is still named and the job ended. Its duration adds to `seconds()[kind]`."""
        paused: Any = self._watchdog.paused(phase) if self._watchdog is not None else contextlib.nullcontext()
        start = time.perf_counter()
        try:
            with paused:
                yield
        finally:
            self._untimed[kind] = self._untimed.get(kind, 0.0) + time.perf_counter() - start

    def seconds(self) -> dict[str, float]:
        """Seconds spent so far in untimed phases, by kind ("eval", "checkpoint", ...)."""
        return dict(self._untimed)
