"""One run per output directory: a lock file naming its holder, kept fresh by a heartbeat.

    lock = OutputLock.acquire("runs/default")      # rank 0, after the inputs are checked
    ...
    lock.release()                                 # run.on_close(lock.release)

Two runs writing into one directory destroy each other (the second moves the first's live
files aside as "an earlier run"; checkpoint renames then fail). The lock file records host,
PID, the process's start time and the command; the holder rewrites its heartbeat every
HEARTBEAT_S seconds. A lock is stale, and taken over with a note, when its holder on this
host is gone (no such PID, or a PID reused by another process), or when a holder on another
host has not beaten for STALE_S seconds (a node that died; a requeued Slurm job then starts
without anyone deleting files). The heartbeat also notices the directory being deleted
under a running job and says so once.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from corecpu import atomic
from corecpu.errors import CoreCPUError
from corecpu.training.checkpoint_disk import process_start

LOCK_NAME = ".corecpu-lock"
HEARTBEAT_S = 20.0
STALE_S = 120.0


def holder_record(now: float) -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": process_start(os.getpid()),
            "started_at": now, "heartbeat": now, "command": " ".join(sys.argv)[:300]}


def stale_reason(holder: dict[str, Any], now: float, host: str,
                 start_of: Callable[[int], str | None] = process_start) -> str | None:
    """Why a lock no longer protects a live run, or None when its holder may still be running."""
    if holder.get("host") == host:
        pid = holder.get("pid")
        if not isinstance(pid, int):
            return "it names no process"
        start = start_of(pid)
        if start is None:
            return f"process {pid} is gone"
        if holder.get("start") is not None and start != holder.get("start"):
            return f"process {pid} is another process now"
        return None
    beat = holder.get("heartbeat")
    if not isinstance(beat, (int, float)) or now - beat > STALE_S:
        age = "never" if not isinstance(beat, (int, float)) else f"{now - beat:.0f} s ago"
        return f"its holder on {holder.get('host')} last beat {age} (over {STALE_S:.0f} s)"
    return None


def describe(holder: dict[str, Any], now: float) -> str:
    started = holder.get("started_at")
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)) if isinstance(started, (int, float)) else "?"
    beat = holder.get("heartbeat")
    last = f", last heartbeat {now - beat:.0f} s ago" if isinstance(beat, (int, float)) else ""
    return f"host {holder.get('host')}, pid {holder.get('pid')}, started {since}{last}"


@dataclass
class OutputLock:
    path: Path
    record: dict[str, Any]
    created_dir: Path | None  # the directory this run created, removed on release if still empty
    note: str | None = None  # a stale lock taken over
    _stop: threading.Event | None = None
    _thread: threading.Thread | None = None

    @classmethod
    def acquire(cls, output_dir: str | Path, *, now: Callable[[], float] = time.time,
                heartbeat: bool = True) -> "OutputLock":
        out = Path(output_dir)
        created = None
        if not out.exists():
            created = _first_missing(out)
            out.mkdir(parents=True, exist_ok=True)
        path = out / LOCK_NAME
        record = holder_record(now())
        note = None
        for _ in range(3):  # another run may take or free it between our attempts
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                holder = _read(path)
                why = "it is unreadable" if holder is None else stale_reason(holder, now(), record["host"])
                if why is None:
                    _remove_created(created)
                    raise CoreCPUError(f"output directory {out} is in use by another run ({describe(holder, now())}); "
                                       f"wait for it to end, pass another --output-dir, or delete {path} if that run "
                                       "is gone") from None
                note = f"took over a stale lock in {out} ({why})"
                path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps(record))
            lock = cls(path, record, created, note)
            if heartbeat:
                lock._start_heartbeat(now)
            return lock
        _remove_created(created)
        raise CoreCPUError(f"could not take the lock {path}: other runs keep taking it; run one job per output directory")

    def _start_heartbeat(self, now: Callable[[], float]) -> None:
        self._stop = threading.Event()

        def beat() -> None:
            warned = False
            while not self._stop.wait(HEARTBEAT_S):
                if not self.path.exists():
                    if not warned:
                        print(f"corecpu: warning: {self.path.parent} was deleted (or its lock removed) during the run; "
                              "metrics.jsonl, config.json and topology.json written so far are lost, checkpoints and "
                              "final/ will be written again", file=sys.stderr, flush=True)
                        warned = True
                    continue
                self.record["heartbeat"] = now()
                try:
                    atomic.write_json(self.path, self.record)
                except OSError:
                    pass  # the directory went away: the next beat says so

        self._thread = threading.Thread(target=beat, name="corecpu-output-lock", daemon=True)
        self._thread.start()

    def release(self) -> None:
        if self._stop is not None:
            self._stop.set()
            if self._thread is not None:
                self._thread.join(timeout=5)
            self._stop = None
        holder = _read(self.path)
        if holder is not None and holder.get("pid") == self.record["pid"] and holder.get("host") == self.record["host"]:
            self.path.unlink(missing_ok=True)
        _remove_created(self.created_dir)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _first_missing(path: Path) -> Path:
    path = path.absolute()
    while not path.parent.exists():
        path = path.parent
    return path


def _remove_created(created: Path | None) -> None:
    """Remove the directories this run created, if nothing was written into them (a run that failed early)."""
    if created is None or not created.exists():
        return
    for d in sorted((p for p in [created, *created.rglob("*")] if p.is_dir()), key=lambda p: -len(p.parts)):
        try:
            d.rmdir()
        except OSError:
            return  # not empty: the run's outputs
