"""Ranks die with their launcher: no orphan keeps a core busy after the job is gone.

Two mechanisms, because the chain launch.sh -> mpirun (a shell script) ->
mpiexec.hydra -> hydra_pmi_proxy -> rank has several links, and killing the top
one with SIGKILL tells nobody below:

- PR_SET_PDEATHSIG: the kernel sends SIGKILL to a rank when the process that
  started it (hydra_pmi_proxy, the torchrun agent, slurmstepd) exits. Set by
  `corecpu.bind` right before exec (it survives exec for non-setuid programs) and
  in-process for ranks started without it.
- The launcher watch: launch.sh exports CORECPU_LAUNCHER_PID=$$. A rank that has
  that process among its ancestors (so: on the same host, same PID namespace)
  watches it through a pidfd and exits when it goes. Remote ranks skip it; their
  proxy dies when the ssh link to mpiexec.hydra drops, and PDEATHSIG does the rest.

Nothing here imports torch.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Mapping

from corecpu.cluster import job_records
from corecpu.cluster.launchers import detect_launcher
from corecpu.cluster.listeners import close_inherited_wildcard_listeners
from corecpu.envvars import LAUNCHER_PID as LAUNCHER_PID_VAR
from corecpu.errors import on_die
from corecpu.reliability import preempt

PR_SET_PDEATHSIG = 1
PR_GET_PDEATHSIG = 2
# A rank that is stopping on request when its launcher disappears gets this long to write its
# checkpoint and exit (a MiniLM save takes about 1 s; Slurm's default KillWait is 30 s).
GRACE_S = 30.0


def _prctl(option: int, arg: int | ctypes.c_int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(option, arg, 0, 0, 0)


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` to this process when its parent exits. False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    if _prctl(PR_SET_PDEATHSIG, sig) != 0:
        return False
    # The parent may have died between our start and the prctl; then nobody will ever tell us.
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)
    return True


def parent_death_signal() -> int:
    """The PDEATHSIG currently set (0: none)."""
    if not sys.platform.startswith("linux"):
        return 0
    value = ctypes.c_int(0)
    if _prctl(PR_GET_PDEATHSIG, ctypes.addressof(value)) != 0:  # type: ignore[arg-type]
        return 0
    return value.value


def ancestors(pid: int, read_stat: Callable[[int], str] | None = None, limit: int = 64) -> list[int]:
    """PIDs of `pid`'s parent, grandparent, ... up to init (from /proc/PID/stat; injectable for tests)."""
    read = read_stat or (lambda p: Path(f"/proc/{p}/stat").read_text())
    out: list[int] = []
    while len(out) < limit:
        try:
            stat = read(pid)
        except OSError:
            break
        # The command name may contain spaces and parentheses; fields after the last ')' are fixed.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid <= 0:
            break
        out.append(ppid)
        pid = ppid
    return out


def launcher_to_watch(env: Mapping[str, str], my_ancestors: list[int]) -> int | None:
    """Pure: the launcher PID to watch, if launch.sh exported one and it is our ancestor."""
    text = env.get(LAUNCHER_PID_VAR, "")
    if not text.isdigit():
        return None
    pid = int(text)
    return pid if pid in my_ancestors else None


def watch_launcher(env: Mapping[str, str], on_gone: Callable[[int], None] | None = None) -> int | None:
    """Exit this process (SIGKILL-like, no clean-up) when the local launch.sh process exits.

    Returns the watched PID, or None when there is nothing to watch (not under launch.sh, another host,
    or no pidfd support).
    """
    pid = launcher_to_watch(env, ancestors(os.getpid()))
    if pid is None or not hasattr(os, "pidfd_open"):
        return None
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None

    def wait() -> None:
        # A pidfd becomes readable when the process exits, so no polling and no PID-reuse race.
        select.select([fd], [], [])
        if on_gone is not None:
            on_gone(pid)
            return
        if preempt.stop_requested():
            # The launcher went down with the stop signal that this rank is acting on (a scheduler signals
            # every process of the job): let the rank save and exit by itself, within the grace.
            _say(f"corecpu: launcher (pid {pid}) is gone while this rank stops; {GRACE_S:.0f} s to finish saving")
            time.sleep(GRACE_S)
        _say(f"corecpu: launcher (pid {pid}) is gone; rank exits")
        preempt.hard_exit(128 + signal.SIGKILL)

    threading.Thread(target=wait, name="corecpu-launcher-watch", daemon=True).start()
    return pid


# A rank whose watchdog found the job hung sends this to `corecpu launch` (when it is the rank's ancestor): a
# stopped rank on another host obeys nothing but SIGKILL, and hydra waits for it; the launcher ends the job.
END_JOB_SIGNAL = signal.SIGUSR2


def ask_launcher_to_end_job(env: Mapping[str, str] | None = None) -> bool:
    """Tell the local `corecpu launch` to tear the whole job down (every host). False when there is none."""
    pid = launcher_to_watch(os.environ if env is None else env, ancestors(os.getpid()))
    if pid is None:
        return False
    try:
        os.kill(pid, END_JOB_SIGNAL)
    except OSError:
        return False
    return True


# What gloo (and MPI over TCP) says when the rank at the other end of a collective has gone.
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def peer_lost_line(rank: int, error: BaseException) -> str | None:
    """Pure: the one line for a collective that failed because another rank ended, else None."""
    text = str(error)
    found = next((m for m in PEER_LOST if m in text), None)
    if not isinstance(error, RuntimeError) or found is None:
        return None
    where = text[text.index(found):].split(". ")[0].rstrip(".")  # "Connection closed by peer [127.0.0.1]:34725"
    return (f"corecpu: error: rank {rank} lost its connection to another rank in a collective ({where}); "
            "that rank ended first, and the launcher's report names it")


def uncaught_record(error: BaseException, step: int | None) -> str:
    """Pure: the "error" record of an exception nothing caught (exit code 1): its type and its message's last line."""
    lines = str(error).strip().splitlines()
    return job_records.error_record(step, 1, f"{type(error).__name__}{': ' + lines[-1].strip() if lines else ''}")


def _current_step() -> int | None:
    # The watchdog module needs torch; a rank that never imported it has no loop, hence no step.
    dog = sys.modules.get("corecpu.reliability.watchdog")
    return getattr(dog, "current_step", lambda: None)()


def quiet_lost_peer(rank: int, env: Mapping[str, str] | None = None) -> None:
    """A rank whose collective meets a rank that died (SIGKILL, the OOM killer) prints one line instead of a
    traceback through torch's internals; the launcher names the rank that died. Any exception nothing caught
    is left in `env`'s job directory (cluster.job_records) for the launcher's report: its last line and step."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: object) -> None:
        line = peer_lost_line(rank, value)
        if line is None:
            previous(kind, value, tb)  # type: ignore[arg-type]
        elif sys.__stderr__ is not None:
            # init_process_group wraps this hook to prefix "[rankN]: " to what it writes to sys.stderr: the
            # line goes to the real stderr, as written.
            print(line, file=sys.__stderr__, flush=True)
        if env is not None:  # after the traceback: the launcher may end the job as soon as it reads this
            try:
                record = uncaught_record(value, _current_step())
            except Exception:  # noqa: BLE001 - the report is a courtesy
                record = job_records.error_record(None, 1, kind.__name__)
            job_records.note(env, rank, "lost" if line is not None else "error", record)

    sys.excepthook = hook


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass  # stderr may be a pipe the launcher already closed


def install(env: Mapping[str, str], launched: bool = True) -> None:
    """For a rank: die with the process that started it and with launch.sh. `launched`: a launcher
    (not a person's shell) is our parent; PDEATHSIG is set only then, so `nohup python train.py &`
    survives its shell. A rank hydra started without corecpu.bind stops the proxy's 0.0.0.0 listener it
    inherited (corecpu.cluster.listeners). A collective that fails because another rank died is one line."""
    close_inherited_wildcard_listeners(env)
    if launched:  # a CoreCPUError's line is printed; the launcher ends the job (MPI_Finalize would wait for it)
        rank = detect_launcher(env).rank
        on_die(lambda _message: job_records.note(env, rank, "error", job_records.error_record(_current_step(), 2)))
    if launched and parent_death_signal() == 0:
        die_with_parent()
    watch_launcher(env)
    if launched:
        quiet_lost_peer(detect_launcher(env).rank, env)
