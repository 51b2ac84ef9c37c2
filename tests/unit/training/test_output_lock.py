"""Tier 1: one run per output directory (corecpu.training.output_lock): holder records, stale locks
on this host and others, release, and the heartbeat noticing a deleted directory."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from corecpu.errors import CoreCPUError
from corecpu.training import output_lock
from corecpu.training.output_lock import LOCK_NAME, OutputLock, process_start, stale_reason


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def write_lock(out, **record):
    out.mkdir(parents=True, exist_ok=True)
    (out / LOCK_NAME).write_text(json.dumps(record))


def test_second_run_is_refused_naming_the_holder(tmp_path):
    out = tmp_path / "run"
    first = OutputLock.acquire(out, heartbeat=False)
    held = json.loads((out / LOCK_NAME).read_text())
    assert held["pid"] == os.getpid() and held["host"] == socket.gethostname() and held["start"] == process_start(os.getpid())
    with pytest.raises(CoreCPUError, match=rf"output directory {out} is in use by another run \(host "
                                           rf"{socket.gethostname()}, pid {os.getpid()}, started .*; wait for it"):
        OutputLock.acquire(out, heartbeat=False)
    first.release()
    assert not (out / LOCK_NAME).exists() and not out.exists()  # created by the run, left empty: removed
    OutputLock.acquire(out, heartbeat=False).release()


def test_release_keeps_a_directory_with_outputs(tmp_path):
    out = tmp_path / "a" / "b"
    lock = OutputLock.acquire(out, heartbeat=False)
    (out / "metrics.jsonl").write_text("{}\n")
    lock.release()
    assert (out / "metrics.jsonl").exists() and not (out / LOCK_NAME).exists()


@pytest.mark.parametrize("record, why", [
    (lambda: {"host": socket.gethostname(), "pid": dead_pid(), "start": "1"}, "is gone"),
    (lambda: {"host": socket.gethostname(), "pid": os.getpid(), "start": "not-my-start"}, "is another process now"),
    (lambda: {"host": "node-elsewhere", "pid": 1, "heartbeat": time.time() - 1000}, "last beat 1000 s ago"),
    (lambda: {"host": "node-elsewhere", "pid": 1}, "last beat never"),
])
def test_stale_locks_are_taken_over_with_a_note(tmp_path, record, why):
    out = tmp_path / "run"
    write_lock(out, **record())
    lock = OutputLock.acquire(out, heartbeat=False)
    assert lock.note is not None and why in lock.note
    assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()


def test_a_live_holder_elsewhere_is_respected(tmp_path):
    out = tmp_path / "run"
    write_lock(out, host="node-elsewhere", pid=1, heartbeat=time.time() - 5, started_at=time.time() - 60)
    with pytest.raises(CoreCPUError, match="host node-elsewhere, pid 1, .* last heartbeat 5 s ago"):
        OutputLock.acquire(out, heartbeat=False)
    assert (out / LOCK_NAME).exists()  # not ours: left alone


def test_stale_reason_is_pure():
    here = "h1"
    assert stale_reason({"host": "h1", "pid": 7, "start": "5"}, 100.0, here, start_of=lambda pid: "5") is None
    assert stale_reason({"host": "h1", "pid": 7, "start": "5"}, 100.0, here, start_of=lambda pid: None) == \
        "process 7 is gone"
    assert stale_reason({"host": "h2", "heartbeat": 90.0}, 100.0, here) is None


def test_heartbeat_refreshes_and_notices_a_deleted_directory(tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(output_lock, "HEARTBEAT_S", 0.05)
    out = tmp_path / "run"
    lock = OutputLock.acquire(out)
    first = json.loads((out / LOCK_NAME).read_text())["heartbeat"]
    time.sleep(0.3)
    assert json.loads((out / LOCK_NAME).read_text())["heartbeat"] > first
    for _ in range(50):  # the heartbeat may drop its next temp file in between (seen under CI load): delete again
        try:
            shutil.rmtree(out)
            break
        except OSError:
            time.sleep(0.01)
    assert not out.exists()
    time.sleep(0.3)
    lock.release()
    err = capfd.readouterr().err
    assert err.count("was deleted (or its lock removed) during the run") == 1
