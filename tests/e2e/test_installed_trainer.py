"""Tier 3: the trainer a pip-installed user has: `corecpu train` runs train.py (the same file, shipped as
corecpu/train.py), `--config` takes a run's own config.json back, and `corecpu launch -n 2 train` with
`--log-dir` writes one log per rank (rank 0 teed to a terminal, with clean bytes in its file) and names a
failed rank's last lines."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers.common import ROOT
from helpers.chaoslib import losses
from helpers.launching import TINY, env_for_launch

SHORT = [*TINY, "--max-steps", "4", "--log-every", "1", "--eval-data", "none", "--batch-size", "8"]


def run(argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in env_for_launch().items() if not k.startswith(("SLURM_", "PMI_", "OMPI_", "MASTER_"))}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def corecpu(*args: str) -> list[str]:
    return [sys.executable, "-m", "corecpu.cli", *args]


def test_corecpu_train_is_train_py_and_config_json_reads_back(tmp_path):
    a = run(corecpu("train", *SHORT, "--output-dir", str(tmp_path / "a")))
    assert a.returncode == 0, a.stdout[-3000:] + a.stderr[-3000:]
    first = losses(tmp_path / "a")
    assert [s for s, _ in first] == [1, 2, 3, 4]
    # the first run's config.json (with its `resolved` and `decisions`) as the whole configuration
    b = run([sys.executable, "train.py", "--config", str(tmp_path / "a" / "config.json"),
             "--output-dir", str(tmp_path / "b")])
    assert b.returncode == 0, b.stdout[-3000:] + b.stderr[-3000:]
    assert losses(tmp_path / "b") == first


def test_launch_train_with_log_dir_and_tee_on_a_terminal(tmp_path):
    # Issue 27: on a terminal (CORECPU_TTY=1), --log-dir sent rank 0 away from the console and wrote its progress
    # bar's escape codes into rank-0.log. With torchrun's --tee, rank 0 stays on the console; the files are clean.
    import pty

    logs = tmp_path / "logs"
    args = ["--model", "tiny", "--precision", "fp32", "--max-steps", "4", "--log-every", "1", "--eval-data", "none",
            "--batch-size", "8", "--progress", "auto", "--output-dir", str(tmp_path / "run")]
    env = {k: v for k, v in env_for_launch().items() if not k.startswith(("SLURM_", "PMI_", "OMPI_", "MASTER_"))}
    # Each worker says one line of its own as it exits (a sitecustomize on the path), so the test does not lean on
    # whatever a library happens to print on rank 1 (CI failed when DeepSpeed's warning was absent). At exit, because
    # the binder that redirects the streams execs the trainer, and only the trainer exits through Python.
    hello = tmp_path / "hello"
    hello.mkdir()
    (hello / "sitecustomize.py").write_text(
        "import atexit, os, sys\n"
        "if 'RANK' in os.environ:\n"
        "    atexit.register(lambda: print(f'worker-bye rank {os.environ[\"RANK\"]}', file=sys.stderr, flush=True))\n")
    env["PYTHONPATH"] = f"{hello}{os.pathsep}{ROOT}"
    master, slave = pty.openpty()
    proc = subprocess.Popen(corecpu("launch", "--nproc-per-node", "2", "--launcher", "torchrun", "--log-dir",
                                    str(logs), "--tee", "0:3", "--redirects", "3", "train", *args),
                            env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    console = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer of the terminal is gone
            break
        if not chunk:
            break
        console += chunk
    os.close(master)
    assert proc.wait(timeout=300) == 0, console[-3000:]
    assert sorted(p.name for p in logs.iterdir()) == ["rank-0.log", "rank-1.log"]
    rank0 = (logs / "rank-0.log").read_bytes()
    assert b"2 rank(s) via torchrun" in rank0 and b"model saved to" in rank0, rank0[-2000:]
    assert b"\x1b" not in rank0 and b"\r" not in rank0  # no escape codes, no progress redraws
    assert b"2 rank(s) via torchrun" in console and b"model saved to" in console  # rank 0 is on the console too
    assert b"worker-bye rank 0" in rank0 and b"worker-bye rank 0" in console
    assert b"worker-bye rank 1" in (logs / "rank-1.log").read_bytes()
    assert b"worker-bye rank 1" not in console  # --redirects 3: rank 1 to its file only
    assert [s for s, _ in losses(tmp_path / "run")] == [1, 2, 3, 4]


def test_a_failed_job_prints_the_failed_ranks_last_lines(tmp_path):
    logs = tmp_path / "logs"
    missing = tmp_path / "missing.tsv"
    r = run(corecpu("launch", "-n", "2", "--launcher", "torchrun", "--log-dir", str(logs),
                    "train", *SHORT, "--data", str(missing), "--output-dir", str(tmp_path / "run")))
    assert r.returncode != 0
    assert f"corecpu launch: the job failed (exit {r.returncode}); rank logs in {logs}" in r.stderr, r.stderr[-3000:]
    summary = r.stderr.split("the job failed", 1)[1]
    # Both ranks find the file missing; whichever exits first has torchrun kill the other, which may not have
    # written its line yet (CI's loaded machine once lost rank 0's): a failed rank's lines, with the cause.
    assert "--- rank " in summary and ", last lines of" in summary and str(missing) in summary, r.stderr[-3000:]
    assert os.path.exists(logs / "rank-1.log")
