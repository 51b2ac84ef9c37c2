"""The checks tests/conftest.py runs after every test must be able to fail: a corecpu-* thread left running is
named, one on its way out within the grace period is not, and other threads are not corecpu's business."""

from __future__ import annotations

import threading
import time

from helpers.leaks import corecpu_threads, lingering_threads


def start(name: str, stop: threading.Event, linger_s: float = 0.0) -> threading.Thread:
    def body() -> None:
        stop.wait()
        time.sleep(linger_s)  # like the watchdog's threads, which notice a stop only when they next wake

    thread = threading.Thread(target=body, name=name, daemon=True)
    thread.start()
    return thread


def test_a_leaked_corecpu_thread_is_named_and_an_older_one_is_not():
    stop = threading.Event()
    older = start("corecpu-test-older", stop)
    before = corecpu_threads()
    leaked = start("corecpu-test-leak", stop)
    other = start("not-corecpu-test", stop)
    try:
        assert lingering_threads(before, grace_s=0.2) == ["corecpu-test-leak"]
    finally:
        stop.set()
        for t in (older, leaked, other):
            t.join(5)
    assert lingering_threads(before, grace_s=0.2) == []
    assert not any(t.is_alive() for t in (older, leaked, other))


def test_a_thread_stopping_within_the_grace_period_is_not_a_leak():
    stop = threading.Event()
    before = corecpu_threads()
    stopping = start("corecpu-test-stopping", stop, linger_s=0.5)
    stop.set()  # asked to stop, gone half a second later
    t0 = time.monotonic()
    assert lingering_threads(before, grace_s=3.0) == []
    assert time.monotonic() - t0 < 2.5 and not stopping.is_alive()  # waited for it, not for the whole grace
