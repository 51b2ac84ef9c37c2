"""What a run holds until it closes, and the one place that releases it.

setup() registers what it started (the process group's store, the measured all-reduce path, the
stop-signal handlers), wrap() and steps() add theirs (a gradient hook's thread, the watchdog), a
loop may add its own (`run.on_close(fn)`). close() calls them last-registered first, once, whatever
ended the run. Nothing else keeps a resource of the run's, so nothing else releases one.
"""

from __future__ import annotations

import gc
from typing import Any, Callable


class Lifetime:
    def __init__(self, store: Any = None) -> None:
        self._store = store  # the rendezvous store: the watchdog's heartbeats go there
        self._closers: list[Callable[[], None]] = []
        self._closed = False

    @property
    def store(self) -> Any:
        """The rendezvous store (None for one process, and once closed)."""
        return self._store

    @property
    def closed(self) -> bool:
        return self._closed

    def on_close(self, fn: Callable[[], None]) -> None:
        """Call `fn` at close (last registered, first called)."""
        self._closers.append(fn)

    def close(self, teardown: Callable[[], None]) -> None:
        """Every closer, then `teardown` (the process group's), even if a closer raised. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            for close in reversed(self._closers):
                close()
        finally:
            teardown()
            # Destroy the rendezvous store now, not during interpreter shutdown, when its C++
            # threads may outlive the objects they use (seen as "terminate called" aborts at exit).
            self._store = None
            gc.collect()
