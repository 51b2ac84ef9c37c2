"""A hung rank is found, named, and ends the job.

A rank that stops (SIGSTOP, a frozen host, a swap storm) leaves the others
waiting inside a collective for as long as the collective timeout: 30 minutes
with gloo, forever with some MPI all-reduces. Here every rank runs two daemon
threads, which work for any transport:

- heartbeat: once a second, writes "BEAT STEP" under corecpu/hb/RANK in the
  rendezvous store (one small write per second, none on the training path).
  BEAT counts up while the process runs, so a stopped process is one whose
  BEAT stands still, whatever its step says.
- checker: after the first step, when no step has completed for the timeout
  (step_timeout, raised to SLOW_FACTOR x the slowest step seen), reads every
  rank's heartbeat twice a few seconds apart, names the ranks whose beat stood
  still (or the ranks behind, if all are alive), prints one line and ends the
  process with EXIT_HUNG; the launcher then takes the other ranks down. A stopped
  rank on this host is killed here; one on another host is out of reach (and hydra
  waits for it), so the ranks also ask `corecpu launch` to end the whole job
  (lifeline.ask_launcher_to_end_job).

The store is served by rank 0, which may itself be the stopped one: every
store read is bounded, and a store that does not answer means rank 0 stopped.
gloo's own collective timeout is lowered to just above the watchdog's, as a
backstop (torchtitan does the same after its first step).

    wd = watch(pg.store, rank, world, step_timeout_s)  # a Watchdog, started (a no-op for one process)
    ...after each optimizer step:  wd.progress(step)
    with wd.paused(): evaluate() / save()      # phases with no step; may take long
    wd.stop()
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Iterator, Mapping

from corecpu.distributed.process_group import COLLECTIVE_TIMEOUT, call_within
from corecpu.reliability import lifeline, preempt

# As coreutils' `timeout`: the job ran out of time waiting. Distinct from 75 (stopped on request, saved).
EXIT_HUNG = 124

HEARTBEAT_EVERY_S = 1.0
SLOW_FACTOR = 5.0  # the timeout is at least this many times the slowest step seen
STORE_TIMEOUT_S = 5.0  # bound on one read of the store
BEATS_TO_WAIT = 3  # heartbeat intervals between the two readings of the peers
REPORTER_HEAD_START_S = 5.0  # ranks that do not report wait this long, so the one that does is heard
GLOO_MARGIN_S = 60.0  # gloo's timeout sits this far above the watchdog's: the watchdog speaks first

KEY = "corecpu/hb/{}"
HOST_KEY = "corecpu/host/{}"


def effective_timeout(step_timeout_s: float, slowest_step_s: float) -> float:
    """Seconds without progress that count as a hang: the configured value, or more for slow steps."""
    return max(step_timeout_s, SLOW_FACTOR * slowest_step_s)


@dataclass(frozen=True)
class Beat:
    beat: int
    step: int

    @classmethod
    def parse(cls, raw: bytes | str) -> "Beat":
        text = raw.decode() if isinstance(raw, bytes) else raw
        beat, step = text.split()
        return cls(int(beat), int(step))


def stopped_ranks(before: Mapping[int, Beat] | None, after: Mapping[int, Beat] | None, world_size: int) -> list[int]:
    """Ranks whose heartbeat did not move between the two readings (rank 0 alone if the store is down)."""
    if before is None or after is None:
        return [0]
    return [r for r in range(world_size) if r not in after or r not in before or after[r].beat == before[r].beat]


def kill_if_same_program(pid: int, proc: str = "/proc") -> bool:
    """SIGKILL `pid` if it runs the same command line as this process (a rank of this job, in this PID
    namespace), not whatever another container's process with that number may be."""
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as theirs, open(f"{proc}/self/cmdline", "rb") as mine:
            if theirs.read() != mine.read():
                return False
        os.kill(pid, signal.SIGKILL)
        return True
    except OSError:
        return False


def diagnose(
    me: int,
    world_size: int,
    before: Mapping[int, Beat] | None,
    after: Mapping[int, Beat] | None,
    hosts: Mapping[int, str],
    my_step: int,
    stalled_s: float,
) -> tuple[str, int]:
    """Pure: (the one line, the rank that should print it). `before`/`after` are None when the store
    did not answer, which means rank 0 (its server) stopped."""
    def who(r: int) -> str:
        return f"rank {r} on {hosts.get(r, 'an unknown host')}"

    waited = f"{stalled_s:.0f} s without progress"
    if before is None or after is None:
        # Nobody can see anybody: rank 1 speaks for all, the others stay quiet.
        return (f"{who(0)} stopped responding at step {my_step} (its rendezvous store does not answer); {waited}",
                1 if world_size > 1 else 0)
    stopped = stopped_ranks(before, after, world_size)
    alive = [r for r in range(world_size) if r not in stopped]
    reporter = min(alive) if alive else me
    if stopped:
        # A heartbeat lags its rank by up to a second; in lockstep DDP a rank stopped while we wait has
        # finished the step we last finished.
        step = max(min((before[r].step for r in stopped if r in before), default=my_step), my_step)
        names = ", ".join(who(r) for r in stopped)
        verb = "stopped" if len(stopped) == 1 else "all stopped"
        return f"{names} {verb} responding at step {step}; {waited}", reporter
    steps = {r: after[r].step for r in range(world_size)}
    low = min(steps.values())
    if low < max(steps.values()):
        behind = [r for r, s in steps.items() if s == low]
        return (f"{', '.join(who(r) for r in behind)} {'is' if len(behind) == 1 else 'are'} behind at step {low} "
                f"(others at {max(steps.values())}); {waited}", reporter)
    return (f"no rank finished step {low + 1}; every rank is alive (a hang inside a collective or the input "
            f"pipeline); {waited}", reporter)


class Watchdog:
    """Per-rank hang detector; see the module docstring. `exit` and `clock` are injectable for tests."""

    def __init__(
        self,
        store: Any,
        rank: int,
        world_size: int,
        step_timeout_s: float,
        host: str | None = None,
        exit: Callable[[int], None] = preempt.hard_exit,
        clock: Callable[[], float] = time.monotonic,
        set_collective_timeout: Callable[[float], None] | None = None,
        ask_launcher: Callable[[], object] | None = None,
    ) -> None:
        self.rank, self.world_size, self.step_timeout_s = rank, world_size, step_timeout_s
        self.host = host or socket.gethostname()
        self._store = store
        self._exit, self._clock = exit, clock
        self._set_collective_timeout = set_collective_timeout or _set_gloo_timeout
        self._ask_launcher: Callable[[], object] = ask_launcher or lifeline.ask_launcher_to_end_job
        self._step = 0
        self._last_progress: float | None = None  # None until the first step: start-up is not timed here
        self._slowest = 0.0
        self._paused = 0
        self._applied_timeout = 0.0
        self._hosts: dict[int, str] = {}
        self._pids: dict[int, int] = {}
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self.fired: str | None = None  # the line, once the watchdog fired (tests read it)
        self._phase = ""  # what the pause is for, named if a rank stops during it
        self._seen: dict[int, tuple[int | None, float]] = {}  # while paused: rank -> (beat, when it last moved)
        self._store_silent_since: float | None = None

    # ------------------------------------------------------------ main-thread API
    def start(self) -> "Watchdog":
        # The first beat is written here, synchronously, so every key exists before anyone can time out.
        self._store.set(HOST_KEY.format(self.rank), f"{os.getpid()} {self.host}")
        self._store.set(KEY.format(self.rank), f"0 {self._step}")
        beat_store, check_store = self._store.clone(), self._store.clone()
        check_store.set_timeout(timedelta(seconds=STORE_TIMEOUT_S))
        self._threads = [
            threading.Thread(target=self._heartbeat, args=(beat_store,), name="corecpu-heartbeat", daemon=True),
            threading.Thread(target=self._check, args=(check_store,), name="corecpu-watchdog", daemon=True),
        ]
        for t in self._threads:
            t.start()
        global _running
        _running = self
        return self

    def progress(self, step: int) -> None:
        """After each optimizer step. Two assignments and a comparison: nothing on the training path waits."""
        now = self._clock()
        if self._last_progress is not None and not self._paused:
            self._slowest = max(self._slowest, now - self._last_progress)
        self._step, self._last_progress = step, now
        self._apply_collective_timeout()

    @contextlib.contextmanager
    def paused(self, phase: str = "evaluation or a checkpoint write") -> Iterator[None]:
        """Evaluation and checkpoint writes take a time no step predicts: steps are not timed, but a rank
        whose heartbeat stands still (a stopped process) still ends the job after step_timeout."""
        self._phase, self._seen, self._store_silent_since = phase, {}, None
        self._paused += 1
        self._set_collective_timeout(0)  # back to the long default for the pause
        self._applied_timeout = 0.0
        try:
            yield
        finally:
            self._paused -= 1
            if self._last_progress is not None:
                self._last_progress = self._clock()
            self._apply_collective_timeout()

    def stop(self) -> None:
        self._stopping.set()
        # Not cleared here: an exception escaping the loop closes it before sys.excepthook reads current_step().

    @property
    def timeout_s(self) -> float:
        return effective_timeout(self.step_timeout_s, self._slowest)

    def _apply_collective_timeout(self) -> None:
        # Only when it moved by a quarter: _set_pg_timeout touches every backend of the group.
        want = self.timeout_s + GLOO_MARGIN_S
        if self._paused or self._last_progress is None or abs(want - self._applied_timeout) < 0.25 * want:
            return
        self._set_collective_timeout(want)
        self._applied_timeout = want

    # ------------------------------------------------------------ threads
    def _heartbeat(self, store: Any) -> None:
        beat = 0
        while not self._stopping.wait(HEARTBEAT_EVERY_S):
            beat += 1
            try:
                store.set(KEY.format(self.rank), f"{beat} {self._step}")
            except Exception:  # noqa: BLE001  rank 0 gone: the checker reports it; nothing to do here
                return

    def _read(self, store: Any, keys: list[str]) -> list[bytes] | None:
        done, values, error = call_within(STORE_TIMEOUT_S + 1.0, lambda: store.multi_get(keys))
        return values if done and error is None else None

    def _beats(self, store: Any) -> dict[int, Beat] | None:
        values = self._read(store, [KEY.format(r) for r in range(self.world_size)])
        return None if values is None else {r: Beat.parse(v) for r, v in enumerate(values)}

    def check_once(self, store: Any, sleep: Callable[[float], None] = time.sleep) -> bool:
        """One look: True if the watchdog fired (and, with the default `exit`, the process is gone)."""
        if self._last_progress is None or self._paused:
            return False
        stalled = self._clock() - self._last_progress
        if stalled < self.timeout_s:
            return False
        seen = self._last_progress
        self._learn_hosts(store)
        before = self._beats(store)
        sleep(BEATS_TO_WAIT * HEARTBEAT_EVERY_S)
        after = self._beats(store) if before is not None else None
        if self._last_progress != seen or self._paused:
            return False  # a step completed meanwhile: slow, not hung
        line, reporter = diagnose(self.rank, self.world_size, before, after, self._hosts, self._step,
                                  self._clock() - seen)
        self.fired = line
        if reporter == self.rank:
            _say(f"corecpu: error: {line}; ending the job")
            self._end_job()  # first: `corecpu launch` then takes the kill below for the hang's, not a failure
            # A stopped process ignores everything but SIGKILL, and mpiexec.hydra waits for it forever.
            for r in stopped_ranks(before, after, self.world_size):
                if self._hosts.get(r) == self.host and r in self._pids:
                    kill_if_same_program(self._pids[r])
        else:
            sleep(REPORTER_HEAD_START_S)
            self._end_job()
        self._exit(EXIT_HUNG)
        return True

    def check_alive(self, store: Any) -> bool:
        """While paused, one look at the heartbeats: True if a rank's stood still for step_timeout seconds
        (or the store, served by rank 0, stayed silent that long) and the watchdog fired."""
        if not self._paused:
            return False
        self._learn_hosts(store)  # while rank 0's store still answers: to name it if it stops
        now, beats = self._clock(), self._beats(store)
        if beats is None:
            self._store_silent_since = self._store_silent_since or now
        else:
            self._store_silent_since = None
            for r, b in beats.items():
                if r not in self._seen or self._seen[r][0] != b.beat:
                    self._seen[r] = (b.beat, now)
        if self._store_silent_since is not None and now - self._store_silent_since >= self.step_timeout_s:
            stale, waited = [0], now - self._store_silent_since
        else:
            stale = [r for r, (_, moved) in sorted(self._seen.items())
                     if r != self.rank and now - moved >= self.step_timeout_s]
            waited = max((now - self._seen[r][1] for r in stale), default=0.0)
        if not stale:
            return False
        names = ", ".join(f"rank {r} on {self._hosts.get(r, 'an unknown host')}" for r in stale)
        line = f"{names} stopped responding during {self._phase}; {waited:.0f} s without a heartbeat"
        self.fired = line
        alive = [r for r in range(self.world_size) if r not in stale]
        if self.rank == min(alive, default=self.rank):
            _say(f"corecpu: error: {line}; ending the job")
            self._end_job()  # first, as in check_once
            for r in stale:
                if self._hosts.get(r) == self.host and r in self._pids:
                    kill_if_same_program(self._pids[r])
        else:
            time.sleep(REPORTER_HEAD_START_S)
            self._end_job()
        self._exit(EXIT_HUNG)
        return True

    def _end_job(self) -> None:
        # Only the launcher reaches a stopped rank on another host (through hydra's proxy there). Every firing
        # rank asks, so the request arrives whichever ranks share the launcher's host; host names are not
        # compared, since two hosts may report the same one. The launcher acts only if the job outlives a grace.
        self._ask_launcher()

    def _learn_hosts(self, store: Any) -> None:
        if self._hosts:
            return
        hosts = self._read(store, [HOST_KEY.format(r) for r in range(self.world_size)])
        if hosts is not None:
            entries = [h.decode().split(" ", 1) for h in hosts]
            self._pids = {r: int(pid) for r, (pid, _) in enumerate(entries)}
            self._hosts = {r: host for r, (_, host) in enumerate(entries)}

    def _check(self, store: Any) -> None:
        while not self._stopping.wait(HEARTBEAT_EVERY_S):
            if self.check_alive(store) if self._paused else self.check_once(store):
                return


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _set_gloo_timeout(seconds: float) -> None:
    """Collective timeout of the default group: `seconds`, or the long start-up default for 0."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_backend() != "gloo":
        return  # torch can change only gloo's (and nccl's); on ccl the watchdog alone names a hung rank
    try:
        from torch.distributed.distributed_c10d import _set_pg_timeout
    except ImportError:  # private API (torch 2.2+); the watchdog works without it
        return
    _set_pg_timeout(timedelta(seconds=seconds) if seconds > 0 else COLLECTIVE_TIMEOUT)


_running: Watchdog | None = None  # this process's latest watchdog: its step names where an uncaught exception hit


def current_step() -> int | None:
    """The optimizer step this process was in (the last one done + 1) when its watchdog last ran; None before
    any loop (read by lifeline's exception hook for the launcher's report)."""
    return None if _running is None else _running._step + 1


class NullWatchdog:
    """The same calls for a single process, which has nobody to wait for."""

    def progress(self, step: int) -> None:
        return None

    @contextlib.contextmanager
    def paused(self, phase: str = "") -> Iterator[None]:
        yield

    def stop(self) -> None:
        return None


def watch(store: Any, rank: int, world_size: int, step_timeout_s: float) -> Watchdog | NullWatchdog:
    """A started watchdog for a distributed run (`store`: ProcessGroup.store), a no-op for one process."""
    if world_size < 2 or store is None:
        return NullWatchdog()
    return Watchdog(store, rank, world_size, step_timeout_s).start()
