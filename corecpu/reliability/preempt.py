"""Stop cleanly on preemption: SIGTERM, SIGINT (Ctrl-C), SIGUSR1 and SIGHUP save the run.

Clusters announce the end of a job with a signal: Slurm's scancel and Kubernetes'
pod eviction send SIGTERM, `sbatch --signal=USR1@60` sends SIGUSR1 a minute
early, a person presses Ctrl-C or closes the terminal (SIGHUP). The first such signal only raises a flag; the
training loop asks `stop_requested_everywhere()` at each optimizer-step boundary,
which agrees on the flag across ranks with one tiny all-reduce (or through the
shared optimizer step's memory, ShmSync.agree_max), so every rank
stops after the same step, writes one checkpoint, and exits with EXIT_STOPPED.
A second signal exits at once, without saving.

Why a watcher thread instead of plain Python signal handlers: Python runs its
handlers only in the main thread between bytecodes, and a rank blocked in a C++
collective (waiting for a peer) would not see the second signal until the
peer answers. `signal.set_wakeup_fd` makes the C-level handler write the
signal number to a pipe, which a daemon thread reads while the main thread is
still inside C++.

    stopper = preempt.install(announce=rank == 0)      # before the loop
    ...after optimizer.step():
    sig = preempt.stop_requested_everywhere()            # collective: every rank calls it
    if sig: save(); print(preempt.stop_line(sig, step, name)); raise SystemExit(preempt.EXIT_STOPPED)
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, NoReturn

# EX_TEMPFAIL from sysexits.h: "temporary failure, try again". Distinct from 1 (a crash), 2 (a usage error)
# and 128+N (killed by signal N without saving), so a wrapper or a scheduler's retry rule can tell "stopped
# on request, checkpoint written, resume me" from "failed". Kubernetes podFailurePolicy and Slurm job
# epilogs can match it.
EXIT_STOPPED = 75

# SIGHUP: the terminal went away; `corecpu launch` stops the job for it as for SIGTERM, so a rank does too,
# and names it (a rank under mpirun gets SIGTERM for it: hydra does not forward SIGHUP, the launcher says so).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP)

# Slurm signals every process of a job step and the launcher forwards the same signal again, so one
# preemption can arrive twice within milliseconds; only a repeat after this long means "exit now".
REPEAT_AFTER_S = 1.0


@dataclass
class StopState:
    """What the watcher thread has seen. Written by one thread, read by the loop; ints are atomic in CPython."""

    signum: int = 0  # the first stop signal received, 0 for none
    first_at: float = 0.0  # time.monotonic() of that signal
    announce: bool = False
    installed: bool = False
    _read_fd: int = -1
    _write_fd: int = -1
    _thread: threading.Thread | None = field(default=None, repr=False)


_state = StopState()


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def on_signal(state: StopState, signum: int, now: float) -> str:
    """Pure decision for one delivered signal: 'stop' (first), 'ignore' (a duplicate delivery) or 'exit'."""
    if signum not in STOP_SIGNALS:
        return "ignore"
    if not state.signum:
        state.signum, state.first_at = signum, now
        return "stop"
    return "exit" if now - state.first_at >= REPEAT_AFTER_S else "ignore"


def _watch(state: StopState) -> None:
    while True:
        try:
            data = os.read(state._read_fd, 64)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            return
        for signum in data:
            action = on_signal(state, signum, time.monotonic())
            if action == "stop" and state.announce:
                _say(f"corecpu: {signal_name(signum)} received: stopping after this step and saving a checkpoint "
                     "(send it again to exit at once without saving)")
            elif action == "exit":
                _say(f"corecpu: second {signal_name(signum)}: exiting now without saving")
                hard_exit(128 + signum)


_exit_cleanups: list[Callable[[], None]] = []


def on_hard_exit(cleanup: Callable[[], None]) -> Callable[[], None]:
    """Run `cleanup` if this process exits at once (a second stop signal, the launcher gone, the watchdog):
    e.g. remove a half-written checkpoint. Returns the function that unregisters it."""
    _exit_cleanups.append(cleanup)
    return lambda: _exit_cleanups.remove(cleanup) if cleanup in _exit_cleanups else None


def hard_exit(code: int) -> NoReturn:
    """Exit now, from any thread (os._exit: nothing waits for the main thread), after the clean-ups."""
    for cleanup in list(_exit_cleanups):
        try:
            cleanup()
        except Exception:  # noqa: BLE001 - exiting anyway; a clean-up must not keep the process alive
            pass
    os._exit(code)


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass  # stderr may be a pipe the launcher already closed


def _noop_handler(signum: int, frame: object) -> None:
    # The watcher thread acts on the wakeup byte; the Python-level handler only has to exist
    # (a handler other than SIG_DFL/SIG_IGN is what makes CPython write the byte).
    return None


def install(announce: bool = False) -> StopState:
    """Catch SIGTERM, SIGINT, SIGUSR1 and SIGHUP from now on. Call once, from the main thread, before the loop.

    `announce`: print a line when the first signal arrives (pass True on rank 0 only).
    Replaces any wakeup fd set before (asyncio's, for one); corecpu's loop has none.
    """
    if _state.installed:
        _state.announce = announce
        return _state
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    for s in STOP_SIGNALS:
        signal.signal(s, _noop_handler)
    _state._read_fd, _state._write_fd, _state.announce, _state.installed = r, w, announce, True
    _state._thread = threading.Thread(target=_watch, args=(_state,), name="corecpu-stop-signals", daemon=True)
    _state._thread.start()
    return _state


def uninstall() -> None:
    """Restore default handlers (tests; a library user who wants Ctrl-C back)."""
    if not _state.installed:
        return
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_DFL if s != signal.SIGINT else signal.default_int_handler)
    signal.set_wakeup_fd(-1)
    os.close(_state._write_fd)  # ends the watcher: read() returns b""
    if _state._thread is not None:
        _state._thread.join(timeout=5)
    os.close(_state._read_fd)
    _state.signum, _state.first_at, _state.installed, _state._thread = 0, 0.0, False, None


def uninstall_unless_stopping() -> None:
    """A run's closer: restore the default handlers; but where a stop signal ended the run, ignore further ones
    until release_after_stop(). The checkpoint is written and the process is on its way out (exit 75): a second
    Ctrl-C during the teardown would meet Python's default handler (KeyboardInterrupt wherever the teardown is, a
    traceback; seen in gc.collect() in CI), or the watcher's "exiting now without saving" after the save."""
    if not _state.signum:
        uninstall()
        return
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)


def release_after_stop() -> None:
    """The end of a stopped run's teardown: the default handlers back (a notebook that caught SystemExit gets its
    Ctrl-C back)."""
    if _state.installed and _state.signum:
        uninstall()


def installed() -> bool:
    """Whether stop signals are being caught (install() ran and uninstall() did not)."""
    return _state.installed


def stop_requested() -> int:
    """This rank's own flag: the first stop signal's number, or 0."""
    return _state.signum


def stop_requested_everywhere(agree: Callable[[int], int] | None = None) -> int:
    """Collective, at an optimizer-step boundary: the stop signal seen by any rank, or 0; the same on every rank.

    `agree(x)`: the ranks' largest x by other means (the shared optimizer step's shared memory); else one
    all-reduce of one int64 (MAX) over the default process group; 0-cost without one.
    """
    import torch
    import torch.distributed as dist

    if agree is not None:
        return agree(_state.signum)
    if not (dist.is_available() and dist.is_initialized()):
        return _state.signum
    flag = torch.tensor([_state.signum], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item())


def stop_line(signum: int, step: int, checkpoint: str, resume_hint: str = "--resume auto") -> str:
    """The one line a stopped run ends with."""
    return (f"stopped by {signal_name(signum)} at step {step}; checkpoint {checkpoint} written; "
            f"continue with {resume_hint}")
