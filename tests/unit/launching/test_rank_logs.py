"""Tier 1: `corecpu launch train` (the packaged train.py) and `--log-dir` (corecpu.launching.rank_logs):
the launch command, each rank's output in its own file through corecpu.bind, and the failure summary."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from corecpu import envvars
from corecpu.launching.launch import parse_args, plan_launch
from corecpu.launching.rank_logs import failure_summary, file_line, log_path, stream_targets
from helpers.common import ROOT


def test_train_is_the_packaged_train_py_run_as_a_module(tmp_path):
    req = parse_args(["-n", "2", "--log-dir", str(tmp_path / "logs"), "train", "--model", "tiny", "--log-dir", "x"])
    assert req.module == "corecpu.train" and req.script_args == ["--model", "tiny", "--log-dir", "x"]
    # the packaged file is the repository's train.py (a symlink here, a copy in the wheel)
    assert Path(req.script).name == "train.py" and Path(req.script).read_text() == (ROOT / "train.py").read_text()
    plan = plan_launch(req, {}, "/env/bin/python", usable_cores=8, which=lambda n: "/x/" + n, port=lambda: 1)
    cmd = plan.command
    assert cmd[cmd.index("--") + 1:] == ["/env/bin/python", "-u", "-m", "corecpu.train", "--model", "tiny",
                                         "--log-dir", "x"]
    assert plan.env[envvars.LOG_DIR] == str(tmp_path / "logs")


def test_without_log_dir_nothing_is_redirected(tmp_path):
    plan = plan_launch(parse_args(["-n", "1", "train"]), {}, "python", 8, which=lambda n: "/x/" + n, port=lambda: 1)
    assert envvars.LOG_DIR not in plan.env


def rank_env(tmp_path, rank: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "SLURM_", "RANK", "LOCAL_RANK"))}
    env.update({"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2",
                "TORCHELASTIC_RUN_ID": "t", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
                envvars.LOG_DIR: str(tmp_path / "logs"), "PYTHONPATH": str(ROOT), **extra})
    return env


def test_bind_sends_the_ranks_stdout_and_stderr_to_its_own_file(tmp_path):
    env = rank_env(tmp_path, 1)
    code = "import sys; print('to stdout'); print('to stderr', file=sys.stderr)"
    r = subprocess.run([sys.executable, "-m", "corecpu.bind", "--oversubscribe", "--", sys.executable, "-c", code],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "to stdout" not in r.stdout and "to stderr" not in r.stderr
    assert log_path(tmp_path / "logs", 1).read_text().splitlines()[-2:] == ["to stdout", "to stderr"]


def test_failure_summary_shows_the_failed_ranks_last_lines(tmp_path):
    log_path(tmp_path, 0).write_text("step 1\nstep 2\n")
    log_path(tmp_path, 1).write_text("".join(f"line {i}\n" for i in range(30))
                                     + "Traceback (most recent call last):\nValueError: bad batch\n")
    log_path(tmp_path, 10).write_text("step 1\n")
    out = failure_summary(tmp_path, lines=3)
    assert out == [f"--- rank 1, last lines of {log_path(tmp_path, 1)}:", "    line 29",
                   "    Traceback (most recent call last):", "    ValueError: bad batch"]


def test_failure_summary_without_a_visible_cause_shows_every_rank(tmp_path):
    for rank in (0, 1, 2):
        log_path(tmp_path, rank).write_text(f"rank {rank} step 5\n")
    out = failure_summary(tmp_path, lines=5)
    assert [line for line in out if line.startswith("---")] == [
        f"--- rank {r}, last lines of {log_path(tmp_path, r)}:" for r in (0, 1, 2)]


def test_stream_targets_follow_torchruns_redirects_and_tee():
    # --log-dir alone: every rank to its file, local rank 0 on the console too
    assert stream_targets(0, "d", None, None, None) == {1: (True, True), 2: (True, True)}
    assert stream_targets(1, "d", None, None, None) == {1: (True, False), 2: (True, False)}
    assert stream_targets(1, "d", "3", None, None) == {1: (True, False), 2: (True, False)}
    assert stream_targets(0, "d", "3", None, None) == {1: (True, False), 2: (True, False)}  # today's --log-dir
    assert stream_targets(1, "d", None, "3", None) == {1: (True, True), 2: (True, True)}
    assert stream_targets(1, "d", None, "0:3,1:1", None) == {1: (True, True), 2: (False, True)}
    assert stream_targets(2, "d", None, "0:3", None) == {1: (False, True), 2: (False, True)}
    assert stream_targets(1, None, None, None, "0") == {1: (False, False), 2: (False, False)}
    assert stream_targets(0, None, None, None, "0") == {1: (False, True), 2: (False, True)}
    assert stream_targets(1, "d", None, "3", "0") == {1: (True, False), 2: (True, False)}  # filter: console only


def test_a_log_line_loses_escape_codes_and_progress_redraws():
    assert file_line(b"\x1b[1;32mstep 10\x1b[0m loss 0.5\n") == b"step 10 loss 0.5\n"
    assert file_line(b"train 1/9\rtrain 5/9\rtrain 9/9\n") == b"train 9/9\n"
    assert file_line(b"\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\\n") == b"link\n"


def test_tee_keeps_the_console_and_writes_clean_bytes_to_the_file(tmp_path):
    # The launcher on a terminal sets CORECPU_TTY=1; a rank teed to a file must not draw for a terminal.
    env = rank_env(tmp_path, 0, **{envvars.LOG_TEE: "3", envvars.TTY: "1"})
    code = ("import os, sys; print('tty', os.environ.get('CORECPU_TTY')); print('\\x1b[1mbold\\x1b[0m', flush=True); "
            "sys.stdout.write('bar 1\\rbar 2\\n'); print('to stderr', file=sys.stderr)")
    r = subprocess.run([sys.executable, "-m", "corecpu.bind", "--oversubscribe", "--", sys.executable, "-c", code],
                       env=env, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split(b"\n") == [b"tty None", b"\x1b[1mbold\x1b[0m", b"bar 1\rbar 2", b""]  # the console: as written
    assert r.stderr.splitlines()[-1] == b"to stderr"
    data = log_path(tmp_path / "logs", 0).read_bytes()
    assert b"\x1b" not in data and b"\r" not in data
    assert data.splitlines()[-4:] == [b"tty None", b"bold", b"bar 2", b"to stderr"]


def test_local_ranks_filter_hides_other_ranks_from_the_console_only(tmp_path):
    env = rank_env(tmp_path, 1, **{envvars.LOG_TEE: "3", envvars.LOG_RANKS_FILTER: "0"})
    r = subprocess.run([sys.executable, "-m", "corecpu.bind", "--oversubscribe", "--", sys.executable, "-c",
                        "print('rank one')"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "rank one" not in r.stdout
    assert log_path(tmp_path / "logs", 1).read_text().splitlines()[-1] == "rank one"
