"""Whole runs for the e2e and chaos tiers: launch.sh with this test run's virtualenv, the records
a run leaves in metrics.jsonl, and train.py runs that must fail in one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers.common import ROOT

TINY = ["--model", "tiny", "--precision", "fp32", "--progress", "off"]


def env_for_launch() -> dict[str, str]:
    # launch.sh uses the active virtualenv: the one running these tests.
    bindir = str(Path(sys.executable).parent)
    return {**os.environ, "VIRTUAL_ENV": str(Path(sys.executable).parent.parent), "PATH": f"{bindir}:{os.environ['PATH']}"}


def launch(n: int, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["bash", str(ROOT / "launch.sh"), str(n), *args], env=env_for_launch(), cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def single(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """train.py in this process's environment, one rank, one thread (as one of two ranks would have)."""
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})


def one_rank_vs_two(tmp_path: Path, common: list[str], steps: int, read=None) -> tuple[list[dict], list[dict]]:
    """The same run as 1 rank x batch 8 and as 2 ranks x batch 4: both step records, checked to agree."""
    read = read or (lambda out: records(out)[0])
    one = single(*common, "--batch-size", "8", "--output-dir", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr
    launch(2, *common, "--batch-size", "4", "--output-dir", str(tmp_path / "two"))
    a, b = read(tmp_path / "one"), read(tmp_path / "two")
    assert len(a) == len(b) == steps
    for ra, rb in zip(a, b):
        assert ra["lr"] == rb["lr"] and abs(ra["loss"] - rb["loss"]) < 1e-5, (ra, rb)
    assert a[0]["loss"] != a[-1]["loss"]  # the model trained
    return a, b


def crash_at_step(n: int, args: list[str], out: Path, step: int, timeout: float = 240) -> list[int]:
    """Start `launch.sh n args --output-dir out`, SIGKILL its whole process group once metrics.jsonl
    reaches `step` (a crash: nothing more is written), and return the checkpoint steps it left."""
    proc = subprocess.Popen(["bash", str(ROOT / "launch.sh"), str(n), *args, "--output-dir", str(out)],
                            env=env_for_launch(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    metrics, deadline = out / "metrics.jsonl", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if metrics.exists() and any(json.loads(line).get("step", 0) >= step
                                        for line in metrics.read_text().splitlines() if line.endswith("}")):
                break
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return sorted(int(p.name.split("-")[1]) for p in (out / "checkpoints").glob("step-*"))


def records(out: Path) -> tuple[list[dict], list[dict]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r], [r for r in rows if "eval_accuracy" in r]


def run_train(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, str]:
    """train.py that must fail: one clear last line, no traceback, no output directory left."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "--model", "tiny", "--output-dir", str(out), *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    assert not out.exists(), "a failed run left an output directory behind"
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("corecpu: error: "), proc.stderr
    return proc, last
