"""`corecpu launch`'s watch over its job: the ranks' records, the line naming the rank that failed, the
supervisor that learns how a rank ended, the teardown that leaves nothing, the last line of a stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from corecpu import envvars
from corecpu.cluster import job_records
from corecpu.cluster.job_records import RankRecord
from corecpu.launching import job_watch
from corecpu.launching.torchrun import stopped_code
from corecpu.reliability.lifeline import uncaught_record
from helpers.common import ROOT


def test_records_round_trip_and_say_who_failed(tmp_path):
    env = {envvars.JOB_DIR: str(tmp_path)}
    assert job_records.note(env, 0, "pid", "4242 host-a") and job_records.note(env, 0, "up")
    assert job_records.note(env, 1, "pid", "4343 host-a")
    assert job_records.note(env, 1, "error", uncaught_record(RuntimeError("bad\nthe last line"), 5))
    assert not job_records.note({}, 0, "up")
    assert not job_records.note({envvars.JOB_DIR: str(tmp_path / "gone")}, 0, "up")  # another host: no such dir
    recs = job_records.read(tmp_path)
    assert recs[0] == RankRecord(0, pid=4242, host="host-a", up=True)
    assert recs[1].error == "RuntimeError: the last line" and recs[1].step == 5 and recs[1].code == 1
    assert not job_records.failed(recs[0]) and job_records.failed(recs[1])
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temporary file left


def test_ended_records():
    for status, bad, code in (("exit 0", False, 0), ("exit 75", False, 75), ("exit 124", False, 124),
                              ("exit 2", True, 2), ("signal 9", True, 137)):
        assert job_records.ended_badly(status) is bad and job_records.exit_code(status) == code


def test_the_line_names_the_rank_its_signal_or_error_and_when():
    killed = RankRecord(0, pid=7, host="h", ended="signal 9")
    assert job_watch.failed_rank_line(killed) == ("corecpu: error: rank 0 (pid 7) on h was killed by SIGKILL during "
                                                  "start-up; corecpu launch ended the job")
    refused = RankRecord(0, pid=7, host="h", code=2)
    assert job_watch.failed_rank_line(refused) == ("corecpu: error: rank 0 (pid 7) on h failed during start-up "
                                                   "(its error is above); corecpu launch ended the job")
    reaped = RankRecord(0, pid=7, host="h", code=2, ended="exit 2")  # its exit seen as soon as its record
    assert job_watch.failed_rank_line(reaped) == job_watch.failed_rank_line(refused)
    other = RankRecord(0, pid=7, host="h", code=2, ended="exit 3")
    assert "exited with code 3" in job_watch.failed_rank_line(other)
    raised = RankRecord(1, pid=8, host="h", up=True, step=5, code=1, error="RuntimeError: boom")
    assert job_watch.failed_rank_line(raised) == ("corecpu: error: rank 1 (pid 8) on h failed at step 5: "
                                                  "RuntimeError: boom; corecpu launch ended the job")
    assert job_watch.exit_code(killed) == 137 and job_watch.exit_code(refused) == 2


def test_the_cause_is_not_a_rank_that_merely_lost_its_peer():
    lost = RankRecord(0, up=True, code=1, lost=True, error="RuntimeError: Connection closed by peer")
    raised = RankRecord(1, up=True, code=1, error="RuntimeError: boom")
    assert job_watch.cause({0: lost, 1: raised}) is raised
    assert job_watch.cause({0: lost}) is lost
    assert job_watch.cause({0: RankRecord(0, ended="exit 75"), 1: RankRecord(1)}) is None


def test_start_up_and_the_last_line_of_a_stop(tmp_path):
    assert job_watch.in_startup({0: RankRecord(0), 1: RankRecord(1)})
    assert not job_watch.in_startup({0: RankRecord(0, up=True), 1: RankRecord(1)}) and not job_watch.in_startup({})
    assert job_watch.last_checkpoint_line(str(tmp_path)) == "corecpu: exited without saving; no checkpoint"
    for step in (3, 12):
        (tmp_path / "checkpoints" / f"step-{step:08d}").mkdir(parents=True)
        (tmp_path / "checkpoints" / f"step-{step:08d}" / "meta.json").write_text("{}")
    (tmp_path / "checkpoints" / ".step-00000015.tmp-99").mkdir()
    assert job_watch.last_checkpoint_line(str(tmp_path)) == "corecpu: exited without saving; last checkpoint step 12"
    assert not job_watch.stop_saved(str(tmp_path), time.time() - 5)
    (tmp_path / "stopped.json").write_text(json.dumps({"step": 12}))
    assert job_watch.stop_saved(str(tmp_path), time.time() - 5) and not job_watch.stop_saved(None, 0)
    assert job_watch.saved_stop_line(str(tmp_path)) is None  # a record without its signal: nothing to rebuild


def test_a_stop_cut_short_after_its_save_still_ends_with_the_ranks_stop_line(tmp_path, monkeypatch):
    # Ctrl-C twice: the ranks saved and wrote stopped.json, then the second signal ended them, perhaps before rank 0's
    # own line was out (seen once in CI). The launcher says that line last, rebuilt from the record word for word.
    from corecpu.reliability import preempt
    from corecpu.training.checkpointer import Checkpoints

    monkeypatch.setattr(job_watch, "kill_job", lambda *args, **kwargs: None)  # this test's process has no job
    (tmp_path / "job").mkdir()
    said: list[str] = []
    watch = job_watch.JobWatch(tmp_path / "job", 0, said.append, output_dir=str(tmp_path)).start()
    assert watch.stop_signal(signal.SIGINT) and not watch.stop_signal(signal.SIGINT)
    (tmp_path / "checkpoints" / "step-00000007").mkdir(parents=True)
    Checkpoints(tmp_path).mark_stopped("SIGINT", 7, tmp_path / "checkpoints" / "step-00000007")
    expected = preempt.stop_line(signal.SIGINT, 7, "step-00000007")
    assert job_watch.saved_stop_line(str(tmp_path)) == expected
    assert watch.finish(128 + signal.SIGINT) == job_watch.EXIT_STOPPED
    assert said == [expected]


def test_torchrun_exits_75_when_every_rank_stopped_and_saved():
    assert stopped_code({0: 75, 1: 75}, signal.SIGTERM) == 75
    assert stopped_code({0: 75, 1: -9}, signal.SIGTERM) == 128 + signal.SIGTERM
    assert stopped_code({}, signal.SIGINT) == 128 + signal.SIGINT


def test_the_supervisor_records_how_its_rank_ended_and_exits_as_a_shell_says(tmp_path):
    code = ("import sys; from corecpu.launching.bind import exec_supervised\n"
            "exec_supervised([sys.executable, '-c', sys.argv[1]], {**__import__('os').environ}, 3)")
    env = {**os.environ, "PYTHONPATH": str(ROOT), envvars.JOB_DIR: str(tmp_path)}
    killed = subprocess.run([sys.executable, "-c", code, "import os; os.kill(os.getpid(), 9)"], env=env, timeout=60)
    assert killed.returncode == 128 + signal.SIGKILL
    rec = job_records.read(tmp_path)[3]
    assert rec.ended == "signal 9" and rec.pid  # the rank's PID (the child)
    forwarded = subprocess.Popen([sys.executable, "-c", code, "import time; print('up', flush=True); time.sleep(60)"],
                                 env=env, stdout=subprocess.PIPE, text=True)
    assert forwarded.stdout.readline().strip() == "up"
    forwarded.send_signal(signal.SIGTERM)  # reaches the rank, which dies of it; the supervisor says so
    assert forwarded.wait(timeout=30) == 128 + signal.SIGTERM
    assert job_records.read(tmp_path)[3].ended == "signal 15"


def test_kill_job_leaves_no_descendant():
    code = ("import subprocess, sys, time; from corecpu.launching import job_watch\n"
            "job_watch.become_subreaper()\n"
            "sh = subprocess.Popen(['sh', '-c', 'sleep 300 & sleep 300 & wait'])\n"
            "time.sleep(0.5); assert len(job_watch.descendants(__import__('os').getpid())) == 3\n"
            "__import__('os').kill(sh.pid, 9); sh.wait(); time.sleep(0.2)\n"
            "orphans = job_watch.descendants(__import__('os').getpid())\n"
            "job_watch.kill_job(); print(len(orphans), len(job_watch.descendants(__import__('os').getpid())))")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["2", "0"], out.stderr  # the orphans came back, then went


def test_a_killed_launcher_s_job_dir_goes_with_the_next_launch(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f"corecpu-job-{gone.stdout.strip()}-abc"  # its PID no longer exists
    live = tmp_path / f"corecpu-job-{os.getppid()}-def"  # a launcher still running
    stale.mkdir(), live.mkdir()
    (stale / "rank-0.pid").write_text("1 h")
    fresh = job_watch.make_job_dir(str(tmp_path))
    assert fresh.name.startswith(f"corecpu-job-{os.getpid()}-") and not stale.exists() and live.exists()


def test_a_killed_torchrun_agent_s_log_dir_goes_with_the_next_one_and_only_its_kind(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f"corecpu-torchrun-{gone.stdout.strip()}-abc"
    other_kind = tmp_path / f"corecpu-job-{gone.stdout.strip()}-abc"  # a launcher's: its own next launch sweeps it
    stale.mkdir(), other_kind.mkdir()
    fresh = job_watch.make_job_dir(str(tmp_path), kind="torchrun")
    assert fresh.name.startswith(f"corecpu-torchrun-{os.getpid()}-") and not stale.exists() and other_kind.exists()
