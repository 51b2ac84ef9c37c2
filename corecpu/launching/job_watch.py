"""`corecpu launch`'s watch over its job: a rank that ends badly ends the job at once and is named; a stop
signal ends the job within a bounded grace; nothing of the job outlives the launcher.

Intel MPI's mpiexec.hydra waits for every rank whatever one of them did, so a rank killed during start-up
(or refusing to start: MASTER_PORT in use) left the others waiting for their whole start-up timeout, and
the launcher forwarded SIGTERM to ranks that could not act on it yet. Now:

- the ranks leave records in a per-job directory (corecpu.cluster.job_records); the first rank that failed
  (a CoreCPUError or an exception nothing caught, as it starts to exit; a signal, or an exit code other
  than 0, 75 and the watchdog's 124, from its supervisor) is named in one line, with its exception's last
  line and step when it left them, and every process of the job is killed;
- a stop signal is forwarded as before; the job then gets STOP_GRACE_S to save and end (START_STOP_GRACE_S
  when no rank has its process group yet: there is nothing to save), and what is left is killed;
- a second stop signal reaches the ranks themselves, late enough that they take it for a second one (not
  the duplicate delivery preempt ignores): they exit at once and remove a half-written checkpoint, where
  mpiexec.hydra's own answer to a second Ctrl-C was SIGKILL;
- the launcher is its job's subreaper: whatever loses its parent (hydra's proxy, a rank) comes back to it,
  and is killed on the way out.

Nothing here imports torch.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from corecpu.cluster import job_records
from corecpu.cluster.job_records import RankRecord
from corecpu.reliability import preempt

START_STOP_GRACE_S = 3.0  # a stop signal before any rank has its process group: nothing to save
STOP_GRACE_S = 30.0  # a stop signal during training: the ranks save first (Slurm's default KillWait is 30 s)
EXIT_STOPPED = preempt.EXIT_STOPPED  # the ranks stopped on request and saved
REPEAT_AFTER_S = preempt.REPEAT_AFTER_S  # a repeat signal sooner than this is taken for a duplicate
POLL_S = 0.1
CAUSE_WAIT_S = 0.5  # after a first bad end, the others' records this long: the cause, not a consequence
PR_SET_CHILD_SUBREAPER = 36


def make_job_dir(root: str | None = None, kind: str = "job") -> Path:
    """A fresh directory, corecpu-KIND-PID-*, named after this process's PID. Those of its kind whose process is
    gone (killed outright, so it could not remove its own) are removed first."""
    root = root or tempfile.gettempdir()
    for old in Path(root).glob(f"corecpu-{kind}-*-*"):
        pid = old.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"corecpu-{kind}-{os.getpid()}-", dir=root))


def become_subreaper() -> bool:
    """Orphaned descendants (hydra's proxy and ranks when mpiexec.hydra dies) are re-parented here, not to init."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _how(rec: RankRecord) -> str:
    # A rank that wrote its own error record and then exited with that code failed, whichever of the two the
    # watcher saw first (a fast machine reaps the exit before the next poll reads the record).
    if not rec.ended or (rec.code and rec.ended == f"exit {rec.code}"):
        return "failed"
    kind, _, value = rec.ended.partition(" ")
    if kind == "signal":
        try:
            return f"was killed by {signal.Signals(int(value)).name}"
        except ValueError:
            return f"was killed by signal {value}"
    return f"exited with code {value}"


def failed_rank_line(rec: RankRecord) -> str:
    """Pure: the one line naming the rank whose end ended the job."""
    where = f" (pid {rec.pid})" if rec.pid else ""
    where += f" on {rec.host}" if rec.host else ""
    when = " during start-up" if not rec.up else (f" at step {rec.step}" if rec.step is not None else "")
    detail = f": {rec.error}" if rec.error and not rec.lost else " (its error is above)" if rec.code == 2 else ""
    return f"corecpu: error: rank {rec.rank}{where} {_how(rec)}{when}{detail}; corecpu launch ended the job"


def cause(records: dict[int, RankRecord]) -> RankRecord | None:
    """Pure: the rank to name among those that ended badly: one that did not merely lose a peer, lowest first."""
    bad = [r for r in records.values() if job_records.failed(r)]
    return min(bad, key=lambda r: (r.lost, r.rank)) if bad else None


def exit_code(rec: RankRecord) -> int:
    """Pure: the job's exit code for the rank that ended it: how it ended, else what its error record says."""
    return job_records.exit_code(rec.ended) if rec.ended else (rec.code or 1)


def in_startup(records: dict[int, RankRecord]) -> bool:
    """Pure: ranks on this host exist and none has its process group yet."""
    return bool(records) and not any(r.up for r in records.values())


def last_checkpoint_line(output_dir: str | None) -> str:
    """The last line of a job that exited without saving: where a resume would start."""
    if output_dir is None:
        return "corecpu: exited without saving"
    steps = sorted(p.parent.name for p in Path(output_dir, "checkpoints").glob("step-*/meta.json"))
    last = f"last checkpoint step {int(steps[-1].split('-')[1])}" if steps else "no checkpoint"
    return f"corecpu: exited without saving; {last}"


def stop_saved(output_dir: str | None, since: float) -> bool:
    """Whether train.py stopped with a checkpoint after `since` (time.time()): its stopped.json is that newer."""
    if output_dir is None:
        return False
    try:
        return os.stat(Path(output_dir, "stopped.json")).st_mtime >= since
    except OSError:
        return False


def saved_stop_line(output_dir: str) -> str | None:
    """The stop line of ranks that saved and said so, rebuilt from their stopped.json (Checkpoints.mark_stopped) for
    when a second signal ended them before their own line was out; None when the record cannot be read."""
    try:
        record = json.loads(Path(output_dir, "stopped.json").read_text())
        signum, step = signal.Signals[record["signal"]], int(record["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    checkpoint = Path(record["checkpoint"]).name if record.get("checkpoint") else f"step-{step}"
    return preempt.stop_line(signum, step, checkpoint, record.get("resume") or "--resume auto")


def descendants(root: int, proc: str = "/proc") -> list[int]:
    """Every process below `root` (from /proc), zombies included, children before grandchildren."""
    children: dict[int, list[int]] = {}
    for stat in Path(proc).glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop(0)
        found.append(pid)
        todo += children.get(pid, [])
    return found


def kill_job(keep: int | None = None, rounds: int = 20) -> None:
    """SIGKILL every descendant of this process and reap the ones that came back to it (not `keep`, the
    launcher child the main thread waits for), until none is left."""
    me = os.getpid()
    for _ in range(rounds):
        pids = descendants(me)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.05)
        reap(keep)


def reap(keep: int | None) -> None:
    """Collect this process's exited children other than `keep` (orphans re-parented to the subreaper)."""
    for pid in descendants(os.getpid()):
        if pid == keep:
            continue
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass  # not our child (a grandchild): its own parent reaps it


class JobWatch:
    """The thread that reads the ranks' records while the launcher child runs. `say` prints one line."""

    def __init__(self, job_dir: Path, child_pid: int, say: Callable[[str], None],
                 output_dir: str | None = None, end_on_failure: bool = True, restate_stop: bool = False) -> None:
        """`end_on_failure`: name a failed rank and end the job (not under torchrun, whose agent does that).
        `restate_stop`: after a stop that saved, say the stop line again, last (the launcher child prints after it)."""
        self.job_dir, self.child_pid, self._say, self.output_dir = job_dir, child_pid, say, output_dir
        self.end_on_failure, self.restate_stop = end_on_failure, restate_stop
        self.code: int | None = None  # the job's exit code when this watch ended it
        self.exited_without_saving = False
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._deadline: float | None = None
        self._stop_signal = 0
        self._hung = False  # a rank's watchdog asked to end the job: ranks killed now are the hang's doing
        self._stop_at = 0.0
        self._stop_wall = 0.0
        self._thread = threading.Thread(target=self._run, name="corecpu-job-watch", daemon=True)

    def start(self) -> "JobWatch":
        self._thread.start()
        return self

    def records(self) -> dict[int, RankRecord]:
        return job_records.read(self.job_dir)

    def stop_signal(self, signum: int) -> bool:
        """A stop signal reached the launcher. True for the first (forward it to the launcher child); a later one
        goes to the ranks directly, as a second signal they exit on at once."""
        now = time.monotonic()
        with self._lock:
            if not self._stop_signal:
                self._stop_signal, self._stop_at, self._stop_wall = signum, now, time.time()
                grace = START_STOP_GRACE_S if in_startup(self.records()) else STOP_GRACE_S
                self._deadline = now + grace
                return True
            self.exited_without_saving = True
            delay = max(0.0, self._stop_at + REPEAT_AFTER_S + 0.1 - now)
            self._deadline = min(self._deadline or float("inf"), now + delay + START_STOP_GRACE_S)
        timer = threading.Timer(delay, self.signal_ranks, args=(signum,))
        timer.daemon = True
        timer.start()
        return False

    def job_hung(self) -> None:
        """A rank's watchdog found the job hung (END_JOB_SIGNAL): it named the rank and ends the job itself."""
        self._hung = True

    def signal_ranks(self, signum: int) -> bool:
        """Send `signum` to the ranks on this host; whether any was there to receive it."""
        sent = False
        for rec in self.records().values():
            if rec.pid:
                try:
                    os.kill(rec.pid, signum)
                    sent = True
                except (ProcessLookupError, PermissionError):
                    pass
        return sent

    def finish(self, code: int) -> int:
        """The launcher child has exited with `code`: stop watching, kill and reap whatever of the job is left,
        say what a stop made of the job, and return the job's exit code."""
        self._done.set()
        self._thread.join(timeout=5)
        kill_job()
        records = self.records()
        shutil.rmtree(self.job_dir, ignore_errors=True)
        if self.code is not None:
            return self.code
        if self._stop_signal and self.restate_stop and stop_saved(self.output_dir, self._stop_wall):
            # Open MPI reports the ranks' exit 75 as a failure, or ends the last rank out with a signal and exits
            # with another code: the record says the stop saved, so say its line last and exit as a stop.
            if (line := saved_stop_line(self.output_dir)) is not None:
                self._say(line)
                return EXIT_STOPPED
        if self._stop_signal and code != EXIT_STOPPED:
            if self.exited_without_saving and stop_saved(self.output_dir, self._stop_wall):
                # The save was done; the second signal only cut the exit short, perhaps before rank 0's line was out
                # (seen once in CI): say it again, last.
                if (line := saved_stop_line(self.output_dir)) is not None:
                    self._say(line)
                return EXIT_STOPPED
            if self.exited_without_saving:
                self._say(last_checkpoint_line(self.output_dir))
            elif in_startup(records):
                self._say(f"corecpu: stopped by {signal.Signals(self._stop_signal).name} during start-up; "
                          "nothing to save")
                return 128 + self._stop_signal
        return code

    def _run(self) -> None:
        while not self._done.wait(POLL_S):
            with self._lock:
                stopping, deadline = self._stop_signal, self._deadline
            if deadline is not None and time.monotonic() >= deadline:
                self._end(128 + stopping, self._stop_line(stopping))
                return
            if stopping or self._hung or not self.end_on_failure or cause(self.records()) is None:
                continue  # while stopping, ranks that end are doing what they were asked
            time.sleep(CAUSE_WAIT_S)
            rec = cause(self.records())
            if rec is not None and not self._stop_signal and not self._hung:
                self._end(exit_code(rec), failed_rank_line(rec))
                return

    def _stop_line(self, signum: int) -> str:
        name = signal.Signals(signum).name
        if self.exited_without_saving:
            return last_checkpoint_line(self.output_dir)
        if in_startup(self.records()):
            return f"corecpu: stopped by {name} during start-up; nothing to save"
        return f"corecpu: error: the job did not end within {STOP_GRACE_S:g} s of {name}; corecpu launch ended it"

    def _end(self, code: int, line: str) -> None:
        self.code = code
        self._say(line)
        kill_job(keep=self.child_pid)
