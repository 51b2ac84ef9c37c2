"""--eval-steps and the step line a log file gets: one rank, a small file, evaluations inside the epoch.

A straight run against one killed after a mid-epoch evaluation and resumed: the same step records and the
same evaluation records (wall-clock fields aside), each evaluation once. The straight run's stdout is a pipe,
as under Slurm or Kubernetes, so it has no progress bar: its step lines carry the epoch, s/step, elapsed and ETA.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers.common import ROOT

WALL_CLOCK = ("samples_per_s", "tokens_per_s", "elapsed_s", "mfu", "eval_runtime", "peak_rss_mb", "rank_peak_rss_mb",
              "wait", "rank_wait", "rank_cpu_others", "rank_cpu_steal")
STEP_LINE = re.compile(r"^step +5/12 \| epoch 0\.42 \| loss \d\.\d{4} \| lr \S+ \| grad_norm \S+ \| .* \| "
                       r"\d+\.\d\d s/step \| elapsed \d+:\d\d \| eta \d+:\d\d$", re.M)


def _data(tmp_path: Path) -> list[str]:
    """96 training rows (12 batches of 8: one rank, 12 steps) and 16 held out."""
    for name, n in (("train.tsv", 96), ("dev.tsv", 16)):
        rows = [f"{'a fine kettle' if i % 2 else 'a broken kettle'} number {i}\t{i % 2}" for i in range(n)]
        (tmp_path / name).write_text("text\tlabel\n" + "\n".join(rows) + "\n")
    return ["--model", "tiny", "--precision", "fp32", "--data", str(tmp_path / "train.tsv"), "--eval-data",
            str(tmp_path / "dev.tsv"), "--batch-size", "8", "--epochs", "1", "--log-every", "1", "--eval-steps", "5",
            "--save-every", "5", "--keep-checkpoints", "3"]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CORECPU_TTY"}  # a log file, not a terminal
    return {**env, "OMP_NUM_THREADS": "1", "CORECPU_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}


def _records(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK} for r in rows]


def test_eval_steps_evaluate_mid_epoch_and_a_killed_run_resumes_exactly(tmp_path):
    args = _data(tmp_path)
    straight = subprocess.run([sys.executable, str(ROOT / "train.py"), *args, "--output-dir", str(tmp_path / "a")],
                              cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert straight.returncode == 0, straight.stdout[-2000:] + straight.stderr[-2000:]
    assert STEP_LINE.search(straight.stdout), straight.stdout[-3000:]
    assert "\x1b[" not in straight.stdout  # no progress bar's escape codes in a log
    rows = _records(tmp_path / "a")
    evals = [r for r in rows if "eval_loss" in r]
    assert [r["step"] for r in evals] == [5, 10, 12]  # every 5 steps, inside the epoch, and the last
    assert [r["epoch"] for r in evals] == [round(s / 12, 4) for s in (5, 10, 12)]  # transformers' epoch
    steps = [r for r in rows if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 13))
    raw = json.loads((tmp_path / "a" / "metrics.jsonl").read_text().splitlines()[0])
    assert raw["learning_rate"] == raw["lr"] and raw["grad_norm"] > 0 and raw["peak_rss_mb"] > 50
    assert raw["rank_peak_rss_mb"] == [raw["peak_rss_mb"]]
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["peak_rss_mb"] >= raw["peak_rss_mb"]

    # Killed (SIGKILL: nothing more written) once step 6 is logged: the step-5 checkpoint, saved after step 5's
    # evaluation, is where the resumed run starts; it must neither repeat that evaluation nor skip one.
    out = tmp_path / "b"
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args, "--output-dir", str(out)], cwd=tmp_path,
                            env=_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            lines = (out / "metrics.jsonl").read_text().splitlines() if (out / "metrics.jsonl").exists() else []
            if any(json.loads(line).get("step", 0) >= 6 for line in lines if line.endswith("}")):
                break
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert (out / "checkpoints" / "step-00000005").is_dir() and not (out / "summary.json").exists()
    resumed = subprocess.run([sys.executable, str(ROOT / "train.py"), *args, "--output-dir", str(out), "--resume",
                              "auto"], cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "(step 5)" in resumed.stdout, resumed.stdout[-2000:]
    assert _records(out) == rows
