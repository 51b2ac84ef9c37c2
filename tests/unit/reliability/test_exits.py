"""Exits that cannot wait still clean up, and the stop signals reach the ranks however they were started."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import torch

from corecpu import atomic
from corecpu.launching import launch
from corecpu.launching.launch import _launcher_child
from corecpu.reliability import preempt
from corecpu.reliability.watchdog import EXIT_HUNG
from corecpu.training import checkpoint_disk
from helpers.common import ROOT

SHOW = "import signal; print(signal.getsignal(signal.SIGTERM) == signal.SIG_IGN, signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN)"


def test_hard_exit_runs_the_cleanups_then_exits_with_the_code(tmp_path):
    marker = tmp_path / "cleaned"
    code = ("from pathlib import Path; from corecpu.reliability import preempt\n"
            f"preempt.on_hard_exit(lambda: Path({str(marker)!r}).write_text('yes'))\n"
            "forget = preempt.on_hard_exit(lambda: 1 / 0)  # a failing clean-up does not stop the exit\n"
            "preempt.hard_exit(75)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 75 and marker.read_text() == "yes", proc.stderr


def test_a_checkpoint_being_written_is_removed_by_a_hard_exit(tmp_path, monkeypatch):
    seen = {}

    def save_and_look(path, state):
        seen["tmp"] = Path(path).parent
        seen["cleanups"] = list(preempt._exit_cleanups)
        Path(path).write_bytes(b"x" * 10)
        return {"bytes": 10}

    monkeypatch.setattr(checkpoint_disk, "write_file", save_and_look)
    checkpoint_disk.write_atomic(tmp_path / "step-00000001", {"a": torch.zeros(1)}, {"step": 1}, "host")
    assert seen["tmp"] == atomic.temp_path(tmp_path / "step-00000001")  # .step-00000001.tmp-HOST-PID
    assert len(seen["cleanups"]) == 1 and not preempt._exit_cleanups  # registered while writing, then forgotten
    seen["tmp"].mkdir()
    seen["cleanups"][0]()  # what hard_exit would run mid-write
    assert not seen["tmp"].exists()


def test_the_launcher_starts_with_stop_signals_ignored_and_bind_gives_them_back():
    # scancel signals every process: impi-rt's mpirun (a shell script) must not die of it; the ranks must.
    plain = subprocess.run([sys.executable, "-c", SHOW], preexec_fn=_launcher_child, capture_output=True, text=True,
                           timeout=60)
    assert plain.stdout.split() == ["True", "True"], plain.stderr
    shell = subprocess.run(["sh", "-c", "trap - TERM; kill -TERM $$; echo survived"], preexec_fn=_launcher_child,
                           capture_output=True, text=True, timeout=60)
    assert shell.stdout.strip() == "survived"  # a shell cannot take back an ignored signal
    bound = subprocess.run([sys.executable, "-m", "corecpu.bind", "--", sys.executable, "-c", SHOW], cwd=ROOT,
                           preexec_fn=_launcher_child, capture_output=True, text=True, timeout=120)
    assert bound.returncode == 0 and bound.stdout.split() == ["False", "False"], bound.stderr
    assert signal.getsignal(signal.SIGTERM) != signal.SIG_IGN  # this process untouched


def test_signals_held_while_the_launcher_starts_its_child_are_not_held_in_the_child():
    # run_forwarding_signals holds the signals it handles until its handlers exist; the child must not inherit that.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, launch.HANDLED)
    try:
        child = subprocess.run(["grep", "^SigBlk", "/proc/self/status"], preexec_fn=_launcher_child,
                               capture_output=True, text=True, timeout=60)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    mask = int(child.stdout.split()[1], 16)
    assert not [s for s in launch.HANDLED if mask & (1 << (s - 1))], child.stdout


def test_a_signal_that_arrives_before_the_handlers_is_handled_not_fatal():
    # The stand-in job signals at once, racing the launcher's handler set-up: held, then handled (exit 124 as below).
    job = ("import os, signal, time; os.kill(int(os.environ['CORECPU_LAUNCHER_PID']), signal.SIGUSR2); "
           "time.sleep(120)")
    code = ("import sys, time, subprocess; from corecpu.launching import launch; launch.END_JOB_GRACE_S = 1.0; "
            "popen = subprocess.Popen\n"
            "def slow(*a, **k):\n    p = popen(*a, **k); time.sleep(2); return p\n"  # the job signals meanwhile
            "subprocess.Popen = slow\n"
            f"rc = launch.run_forwarding_signals([sys.executable, '-c', {job!r}], {{}}, 'mpirun'); print(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert (out.returncode, out.stdout.strip()) == (0, str(EXIT_HUNG)), out.stderr


def test_a_hung_job_that_outlives_the_grace_is_killed_by_the_launcher_with_exit_124():
    # The stand-in job asks to be ended (as a watchdog does) and then waits like a stopped rank's peers under hydra.
    assert launch.EXIT_HUNG == EXIT_HUNG  # launch.py repeats it to stay torch-free
    job = ("import os, signal, time; os.kill(int(os.environ['CORECPU_LAUNCHER_PID']), signal.SIGUSR2); "
           "time.sleep(120)")
    code = ("import sys, time; from corecpu.launching import launch; launch.END_JOB_GRACE_S = 1.0; t = time.monotonic(); "
            f"rc = launch.run_forwarding_signals([sys.executable, '-c', {job!r}], {{}}, 'mpirun'); "
            "print(rc, round(time.monotonic() - t))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    rc, waited = out.stdout.split()
    assert (rc, out.stderr) == (str(EXIT_HUNG), "") and int(waited) < 10


def test_a_hung_job_that_ends_by_itself_keeps_its_own_exit_code():
    job = "import os, signal; os.kill(int(os.environ['CORECPU_LAUNCHER_PID']), signal.SIGUSR2); raise SystemExit(3)"
    code = ("import sys; from corecpu.launching import launch; launch.END_JOB_GRACE_S = 1.0; "
            f"print(launch.run_forwarding_signals([sys.executable, '-c', {job!r}], {{}}, 'mpirun'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.stdout.strip() == "3", out.stderr


HUP_JOB = ("import os, signal, time; from corecpu.reliability import preempt; preempt.install(); "
           "os.kill(int(os.environ['CORECPU_LAUNCHER_PID']), signal.SIGHUP); t = time.monotonic()\n"
           "while not preempt.stop_requested() and time.monotonic() - t < 20: time.sleep(0.05)\n"
           "print(preempt.stop_line(preempt.stop_requested(), 7, 'step-7')); raise SystemExit(75)")


def test_sighup_is_named_as_itself_or_the_launcher_says_why_not():
    # Issue 30 case 11(d): a closed terminal (SIGHUP) ended as "stopped by SIGTERM", with no word of SIGHUP.
    def run(launcher: str) -> subprocess.CompletedProcess:
        code = ("import sys; from corecpu.launching import launch; "
                f"sys.exit(launch.run_forwarding_signals([sys.executable, '-c', {HUP_JOB!r}], {{}}, {launcher!r}))")
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)

    torchrun = run("torchrun")  # torchrun's agent passes the signal it got on to every worker
    assert torchrun.returncode == 75 and torchrun.stdout.startswith("stopped by SIGHUP at step 7"), torchrun.stderr
    mpirun = run("mpirun")
    assert mpirun.returncode == 75 and mpirun.stdout.startswith("stopped by SIGTERM at step 7"), mpirun.stderr
    assert mpirun.stderr == ("corecpu launch: SIGHUP received; passed to the ranks as SIGTERM (Intel MPI does not "
                             "forward SIGHUP): they stop after this step and save\n")


def test_a_rank_stops_and_saves_on_sighup():
    state = preempt.StopState()
    assert preempt.on_signal(state, signal.SIGHUP, now=0.0) == "stop"
    assert preempt.stop_line(state.signum, 3, "step-3").startswith("stopped by SIGHUP at step 3")
