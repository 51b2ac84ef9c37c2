"""Chaos tier: two runs aimed at one --output-dir, and a directory deleted under a running job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

from helpers.chaoslib import ROOT, TINY

LONG = [*TINY, "--max-steps", "600", "--epochs", "100", "--log-every", "1", "--eval-data", "none"]


def start(out, *extra):
    return subprocess.Popen([sys.executable, str(ROOT / "train.py"), *LONG, "--output-dir", str(out), *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def wait_for_steps(out, n, proc, timeout=120):
    deadline = time.monotonic() + timeout
    metrics = out / "metrics.jsonl"
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and sum(1 for l in metrics.read_text().splitlines() if '"loss"' in l) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"no {n} steps in {out}: {proc.poll()}")


def test_a_second_run_into_a_busy_directory_is_refused_and_the_first_finishes(tmp_path):
    out = tmp_path / "shared"
    first = start(out)
    try:
        wait_for_steps(out, 3, first)
        second = subprocess.run([sys.executable, str(ROOT / "train.py"), *LONG, "--output-dir", str(out)], cwd=ROOT,
                                capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert second.returncode == 2, second.stderr
        last = second.stderr.strip().splitlines()[-1]
        assert last.startswith(f"corecpu: error: output directory {out} is in use by another run (host ")
        assert f"pid {first.pid}" in last and "Traceback" not in second.stderr
        _, err = first.communicate(timeout=300)
        assert first.returncode == 0, err[-2000:]
    finally:
        first.kill()
    assert not list(out.glob("previous-*")) and not (out / ".corecpu-lock").exists()
    steps = [json.loads(l)["step"] for l in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in l]
    assert steps == list(range(1, 601))
    assert (out / "final" / "config.json").exists()


def test_deleting_the_directory_mid_run_is_reported(tmp_path):
    out = tmp_path / "doomed"
    run = start(out, "--max-steps", "100000")
    warning = f"corecpu: warning: {out} was deleted (or its lock removed) during the run"
    err: list[str] = []
    # Both pipes drained as the run writes them; the warning is waited for, not slept for.
    readers = [threading.Thread(target=lambda: err.extend(run.stderr), daemon=True),
               threading.Thread(target=lambda: run.stdout.read(), daemon=True)]
    try:
        for reader in readers:
            reader.start()
        wait_for_steps(out, 2, run)
        subprocess.run(["rm", "-rf", str(out)], check=True)
        deadline = time.monotonic() + 30  # the lock's heartbeat notices within HEARTBEAT_S (20 s)
        while time.monotonic() < deadline and not any(warning in line for line in err) and run.poll() is None:
            time.sleep(0.1)
    finally:
        run.terminate()
        run.wait(timeout=120)
        for reader in readers:
            reader.join(timeout=10)
    assert any(warning in line for line in err), "".join(err)[-3000:]
