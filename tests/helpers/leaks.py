"""What a test may not leave behind, beyond os.environ and the process group (tests/conftest.py checks
those itself): corecpu's own threads, all named "corecpu-..." (heartbeat, watchdog, stop-signals,
mpi-allreduce, shm-allreduce, launcher-watch, rendezvous)."""

from __future__ import annotations

import threading
import time
from collections.abc import Collection

PREFIX = "corecpu-"
GRACE_S = 3.0  # threads stop asynchronously: the watchdog's wake once a second


def corecpu_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith(PREFIX)}


def lingering_threads(before: Collection[threading.Thread], grace_s: float = GRACE_S) -> list[str]:
    """Names of corecpu-* threads alive now that were not in `before`, after joining each for what is
    left of `grace_s` seconds (a thread that is only on its way out is not a leak)."""
    deadline = time.monotonic() + grace_s
    new = [t for t in corecpu_threads() if t not in before]
    for t in new:
        t.join(max(0.0, deadline - time.monotonic()))
    return sorted(t.name for t in new if t.is_alive())
