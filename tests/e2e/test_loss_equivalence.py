"""The refactor of the front door (issue 25) changes no math: for both tasks, the built-in job logs the
same per-step records and ends with the same weights as main did when that work began (c134c55), and
resumes bit for bit from a checkpoint that c134c55 wrote mid-run.

Both sides run here, on this machine, in this test: c134c55 is exported from git history (`git archive`)
and runs its own train.py and package, so the comparison is exact (fp32, 2 ranks, tiny model, every step
logged). Every field of c134c55's metrics.jsonl except wall-clock rates is compared with ==, evaluations
included (the epoch as its index: records now carry transformers' fractional epoch),
as are the ranks' parameter checksums in summary.json and, for qa, predictions.json byte for byte.
c134c55 already evaluates each shard longest first (issue 16), so unlike the earlier comparison with main
before the reshape (317d209, which CI showed c134c55 matches) no eval loss needs a tolerance.
- classification: the built-in sentiment set with gradient accumulation, its first epoch's short last group
  (step 63), the epoch boundary and 7 steps of the second epoch (--max-steps 70 of --epochs 2), and two
  evaluations (the epoch's end and the last step); resumed from c134c55's step-50 checkpoint, so the resumed
  run crosses the boundary itself. (2 whole epochs, 126 steps, checked nothing more at twice the time.)
- qa: 12 steps of the built-in QA set in 96-token windows (several per context) with gradient
  accumulation and SQuAD scoring of all 400 eval questions at the end; resumed from step 6. (An epoch of
  the QA set is hundreds of steps, so its epoch boundary is left to classification.)
Each side tokenizes into its own cache directory, so neither reads features the other built (they share
only the built DeepSpeed op, helpers.common.fresh_cache).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.common import fresh_cache

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = "c134c55b11ee1cc6286b22d31ba8f401bf3951c4"  # main when issue 25's refactor began
COMMON = ["--model", "tiny", "--precision", "fp32", "--progress", "off", "--log-every", "1", "--keep-checkpoints", "3"]
# c134c55's kernels and rounding: auto may time eager faster, the fused clip divides by 1/c inside AdamW's step,
# and a classifier's last layer at its first token rounds its sums in another order.
CURRENT = ["--attention", "sdpa", "--dropout", "torch", "--grad-clip", "torch", "--last-layer", "full"]
WALL_CLOCK = ("samples_per_s", "tokens_per_s", "elapsed_s", "mfu", "wait", "rank_wait", "rank_cpu_others",
              "rank_cpu_steal")  # timings and the host's load differ run to run; nothing else may


@dataclass(frozen=True)
class Job:
    args: list[str]
    steps: int  # optimizer steps the run takes
    evals: int  # evaluation records it writes
    epochs: int  # epochs its steps touch
    resume_at: int  # the c134c55 checkpoint a resumed run starts from


JOBS = {
    "classification": Job(["--epochs", "2", "--max-steps", "70", "--batch-size", "8", "--grad-accum", "2",
                           "--save-every", "50"], steps=70, evals=2, epochs=2, resume_at=50),
    "qa": Job(["--task", "qa", "--max-steps", "12", "--batch-size", "4", "--grad-accum", "2", "--max-seq-len", "96",
               "--doc-stride", "32", "--save-every", "6"], steps=12, evals=1, epochs=1, resume_at=6),
}


def _env(cache: Path, **extra: str) -> dict[str, str]:
    bindir = str(Path(sys.executable).parent)  # mpirun (impi-rt) lives beside the venv's python
    return {**os.environ, "VIRTUAL_ENV": str(Path(bindir).parent), "PATH": f"{bindir}:{os.environ['PATH']}",
            "CORECPU_CACHE_DIR": str(cache), **extra}


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def _records(out: Path) -> list[dict]:
    rows = map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK} for r in rows]


def _checksums(out: Path) -> list[float]:
    return [r["param_checksum"] for r in json.loads((out / "summary.json").read_text())["ranks"]]


def _epoch_index(epoch: float) -> int:
    """c134c55's 0-based epoch index from a record's epoch: since issue 27 transformers' fractional epoch
    (1.0 at the end of the first), which is above the index of the epoch the step belongs to."""
    return epoch if isinstance(epoch, int) else max(math.ceil(epoch) - 1, 0)


def _same(out: Path, reference: Path) -> None:
    """Every field c134c55 wrote, equal; fields added since (learning_rate, grad_norm, ...) are not in it."""
    after, before = _records(out), _records(reference)
    assert len(after) == len(before)
    for a, b in zip(after, before):
        assert set(b) <= set(a), (a, b)
        assert {**{k: a[k] for k in b}, "epoch": _epoch_index(a["epoch"])} == b
        assert a.get("learning_rate", a.get("lr")) == a.get("lr")
    assert _checksums(out) == _checksums(reference)
    if (reference / "predictions.json").exists():
        assert (out / "predictions.json").read_bytes() == (reference / "predictions.json").read_bytes()


@pytest.fixture(scope="module")
def reference_tree(tmp_path_factory) -> Path:
    """c134c55's files, exported from this clone's history."""
    if subprocess.run(["git", "cat-file", "-e", f"{REFERENCE}^{{commit}}"], cwd=ROOT, capture_output=True).returncode:
        pytest.skip(f"needs commit {REFERENCE[:7]} (main when issue 25 began) in this clone's history")
    tree = tmp_path_factory.mktemp("reference-tree")
    archive = subprocess.run(["git", "archive", REFERENCE], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


@pytest.fixture(scope="module")
def current_cache(tmp_path_factory) -> Path:
    return fresh_cache(tmp_path_factory.mktemp("current-cache"))


@pytest.fixture(scope="module")
def reference_cache(tmp_path_factory) -> Path:
    return fresh_cache(tmp_path_factory.mktemp("reference-cache"))


@pytest.fixture(scope="module", params=list(JOBS))
def reference(request, reference_tree, reference_cache, tmp_path_factory) -> tuple[Job, Path]:
    """One uninterrupted c134c55 run per task (run once for the module): its records and checkpoints."""
    job = JOBS[request.param]
    out = tmp_path_factory.mktemp(f"reference-{request.param}")
    _run([sys.executable, "-m", "corecpu.launch", "--default-script", str(reference_tree / "train.py"), "2", *COMMON,
          *job.args, "--output-dir", str(out)], cwd=reference_tree,
         env=_env(reference_cache, PYTHONPATH=str(reference_tree)))
    records = _records(out)
    assert len([r for r in records if "loss" in r]) == job.steps
    assert len([r for r in records if "eval_examples" in r]) == job.evals
    assert len({r["epoch"] for r in records if "loss" in r}) == job.epochs
    return job, out


def test_fresh_run_equals_c134c55(reference, current_cache, tmp_path):
    job, before = reference
    out = tmp_path / "after"
    _run(["bash", str(ROOT / "launch.sh"), "2", *COMMON, *CURRENT, *job.args, "--output-dir", str(out)], cwd=ROOT,
         env=_env(current_cache))
    _same(out, before)


def test_resumes_exactly_from_a_c134c55_checkpoint(reference, current_cache, tmp_path):
    # The output directory as c134c55 would have left it when stopped after its mid-run checkpoint.
    job, before = reference
    out = tmp_path / "resumed"
    kept = f"step-{job.resume_at:08d}"
    shutil.copytree(before, out, ignore=lambda d, names: [n for n in names if n in ("final", "summary.json",
                    "predictions.json") or (n.startswith("step-") and n != kept)])
    lines = (before / "metrics.jsonl").read_text().splitlines(keepends=True)
    (out / "metrics.jsonl").write_text("".join(line for line in lines if json.loads(line)["step"] <= job.resume_at))
    stdout = _run(["bash", str(ROOT / "launch.sh"), "2", *COMMON, *CURRENT, *job.args, "--resume", "auto",
                   "--output-dir", str(out)], cwd=ROOT, env=_env(current_cache))
    # Resumed rather than trained from scratch (which would also match); train.py's banner says which.
    assert f"checkpoints/{kept} (step {job.resume_at})" in stdout
    _same(out, before)  # records to step resume_at kept, every later one recomputed, final weights the same
