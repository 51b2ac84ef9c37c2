"""The package reshape (issue 13) changed no math: the built-in job logs the same per-step losses and
evaluations as main before it, and resumes bit for bit from a checkpoint that main wrote.

Both sides run here, on this machine, in this test: main before the reshape is exported from git
history (`git archive`), so the comparison is exact (fp32, 2 ranks, tiny model, every step logged),
with gradient accumulation, a short last group, an epoch boundary and evaluation inside the window.
One deliberate change since: each rank evaluates its shard longest first (issue 16), so the mean eval loss
is summed in another order; it is compared to 1e-6 relative, everything else exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BEFORE = "317d209ae6d280ab60190852334afa3285c02c10"  # main before the reshape
ARGS = ["--model", "tiny", "--precision", "fp32", "--progress", "off", "--log-every", "1", "--epochs", "2",
        "--batch-size", "8", "--grad-accum", "2", "--save-every", "50", "--keep-checkpoints", "3"]


def _env(**extra: str) -> dict[str, str]:
    bindir = str(Path(sys.executable).parent)  # mpirun (impi-rt) lives beside the venv's python
    return {**os.environ, "VIRTUAL_ENV": str(Path(bindir).parent), "PATH": f"{bindir}:{os.environ['PATH']}", **extra}


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> None:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _records(out: Path) -> list[dict]:
    keep = ("step", "epoch", "loss", "lr", "samples", "padding", "eval_loss", "eval_accuracy", "eval_f1")
    return [{k: r[k] for k in keep if k in r} for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())]


def _same(after: list[dict], before: list[dict]) -> None:
    assert len(after) == len(before)
    for a, b in zip(after, before):
        assert a.keys() == b.keys(), (a, b)
        if "eval_loss" in b:
            assert a["eval_loss"] == pytest.approx(b["eval_loss"], rel=1e-6), (a, b)
            a, b = {k: v for k, v in a.items() if k != "eval_loss"}, {k: v for k, v in b.items() if k != "eval_loss"}
        assert a == b


def _checksums(out: Path) -> list[float]:
    return [r["param_checksum"] for r in json.loads((out / "summary.json").read_text())["ranks"]]


@pytest.fixture(scope="module")
def before(tmp_path_factory) -> Path:
    """The pre-reshape main's run: its records, and its checkpoints to resume from."""
    if subprocess.run(["git", "cat-file", "-e", f"{BEFORE}^{{commit}}"], cwd=ROOT, capture_output=True).returncode:
        pytest.skip(f"needs commit {BEFORE[:7]} (main before the reshape) in this clone's history")
    tree = tmp_path_factory.mktemp("before-tree")
    archive = subprocess.run(["git", "archive", BEFORE], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    out = tmp_path_factory.mktemp("before-run")
    _run([sys.executable, "-m", "corecpu.launch", "--default-script", str(tree / "train.py"), "2", *ARGS,
          "--output-dir", str(out)], cwd=tree, env=_env(PYTHONPATH=str(tree)))
    return out


def test_same_losses_and_evaluations_as_before_the_reshape(before, tmp_path):
    out = tmp_path / "after"
    _run(["bash", str(ROOT / "launch.sh"), "2", *ARGS, "--output-dir", str(out)], cwd=ROOT, env=_env())
    expected = _records(before)
    assert len([r for r in expected if "loss" in r]) == 126 and len([r for r in expected if "eval_loss" in r]) == 2
    _same(_records(out), expected)
    assert _checksums(out) == _checksums(before)


def test_resumes_exactly_from_a_checkpoint_written_before_the_reshape(before, tmp_path):
    out = tmp_path / "resumed"
    (out / "checkpoints").mkdir(parents=True)
    old = before / "checkpoints" / "step-00000050"
    subprocess.run(["cp", "-r", str(old), str(out / "checkpoints")], check=True)
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records(before) if r["step"] <= 50))
    _run(["bash", str(ROOT / "launch.sh"), "2", *ARGS, "--resume", "auto", "--output-dir", str(out)], cwd=ROOT,
         env=_env())
    _same(_records(out), _records(before))  # steps 51-126 (an epoch boundary, two evaluations) the same
    assert _checksums(out) == _checksums(before)
