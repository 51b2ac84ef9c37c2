"""Tier 1: `corecpu export`'s choices before any model is built: which checkpoint a CHECKPOINT and --step name,
and the run's configuration read back from a checkpoint (corecpu.checkpoint_export). The export itself, weights
bit for bit through from_pretrained: tests/e2e/test_export.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corecpu.checkpoint_export import config_from_saved, export_checkpoint, find_checkpoint
from corecpu.tasks.registry import parse_config
from helpers.one_line import one_line_error


def fake_run(out: Path, steps: list[int], best: int | None = None) -> Path:
    for i, step in enumerate(steps):
        d = out / "checkpoints" / f"step-{step:08d}"
        d.mkdir(parents=True)
        (d / "state.pt").write_bytes(b"x")
        extra = {"best": {"metric": "eval_f1", "value": 0.9, "step": best, "checkpoint": f"step-{best:08d}"}
                 } if best else {}
        (d / "meta.json").write_text(json.dumps({"step": step, "saved_at": 100.0 + i, "extra": extra}))
    return out


def test_a_run_directory_gives_latest_best_or_a_step(tmp_path):
    run = fake_run(tmp_path / "run", [4, 8, 12], best=4)
    root = run / "checkpoints"
    assert find_checkpoint(run) == find_checkpoint(run, "latest") == root / "step-00000012"
    assert find_checkpoint(run, "best") == root / "step-00000004"
    assert find_checkpoint(run, "8") == root / "step-00000008"
    assert find_checkpoint(root / "step-00000008") == root / "step-00000008"


def test_what_cannot_be_found_is_one_line_naming_the_fix(tmp_path):
    run = fake_run(tmp_path / "run", [4, 8])
    one_line_error(lambda: find_checkpoint(run, "5"), "has no checkpoint of step 5; it has steps 4, 8")
    one_line_error(lambda: find_checkpoint(run, "best"), "trained without --keep-best METRIC", "--step latest")
    one_line_error(lambda: find_checkpoint(run, "newest"), "is not a step number, latest or best")
    one_line_error(lambda: find_checkpoint(run / "checkpoints" / "step-00000004", "4"), "drop --step")
    one_line_error(lambda: find_checkpoint(tmp_path / "empty"), "no complete checkpoint in")
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / "x").write_text("")
    one_line_error(lambda: export_checkpoint(run, tmp_path / "dest"), "is not empty; remove it or choose another")


def test_a_damaged_checkpoint_is_refused_in_one_line(tmp_path):
    run = fake_run(tmp_path / "run", [4])
    meta = run / "checkpoints" / "step-00000004" / "meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "files": {"state.pt": {"bytes": 99}}}))
    one_line_error(lambda: export_checkpoint(meta.parent, tmp_path / "out"),
                   "state.pt has 1 bytes, meta.json records 99", "pass another checkpoints/step-* directory")


@pytest.mark.parametrize("argv", [
    ["--model", "tiny", "--lr", "3e-4", "--keep-best", "f1", "--label-column", "y"],
    ["--task", "qa", "--doc-stride", "64", "--precision", "fp32"],
    ["--task", "causal-lm", "--lora-r", "4", "--lora-target-modules", "q_proj,v_proj", "--packing"],
])
def test_the_run_configuration_reads_back_from_what_a_checkpoint_records(argv):
    cfg = parse_config(argv)
    saved = {**cfg.to_dict(), "label_names": ["a", "b"], "resolved": {"threads": 2}, "a_key_of_another_version": 1}
    back = config_from_saved(saved)
    assert back.to_dict() == cfg.to_dict() and type(back.task_options) is type(cfg.task_options)
    assert config_from_saved(saved, model="/elsewhere").model == "/elsewhere"


def test_an_unknown_task_names_register():
    one_line_error(lambda: config_from_saved({"task": "regression"}), "--task regression", "register the task")
