"""Tier 3: train.py refuses bad input in one line before any work, and a fresh run sets an earlier
run's outputs aside (the checks themselves: tests/unit/training/test_inputs.py)."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers.common import ROOT


def train(tmp_path, *args):
    return subprocess.run([sys.executable, str(ROOT / "train.py"), "--model", "tiny", "--progress", "off", *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)


def test_train_refuses_long_max_seq_len_and_file_output_dir_in_one_line(tmp_path):
    for args, words in ((["--max-seq-len", "1000"], "longer than the model"),
                        (["--output-dir", str(tmp_path / "file")], "is a file")):
        (tmp_path / "file").write_text("x")
        proc = train(tmp_path, "--output-dir", str(tmp_path / "out"), *args)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert words in proc.stderr.strip().splitlines()[-1]
        assert not (tmp_path / "out").exists()


def test_train_fresh_run_sets_earlier_outputs_aside(tmp_path):
    out = tmp_path / "out"
    common = ["--max-steps", "2", "--eval-data", "none", "--output-dir", str(out)]
    assert train(tmp_path, *common).returncode == 0
    second = train(tmp_path, *common)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "held an earlier run's outputs" in second.stdout and "resume from" in second.stdout
    previous = [p for p in out.iterdir() if p.name.startswith("previous-")]
    assert len(previous) == 1 and (previous[0] / "final").is_dir() and (previous[0] / "summary.json").is_file()
    assert json.loads((out / "summary.json").read_text())["steps"] == 2 and (out / "final").is_dir()
