"""Tier 1: the configuration surface (corecpu.training.config) and the `corecpu make-data` command."""

from __future__ import annotations

import dataclasses

import pytest

from corecpu.training.config import TrainConfig, build_parser, parse_config
from corecpu.training.options import RunOptions
from corecpu.errors import CoreCPUError


def test_every_config_field_is_a_flag_with_help():
    parser = build_parser()
    text = parser.format_help()
    fields = [f for f in dataclasses.fields(TrainConfig) if f.name != "run"] + list(dataclasses.fields(RunOptions))
    for f in fields:
        assert "--" + f.name.replace("_", "-") in text and f.metadata["help"]
    assert parse_config([]) == TrainConfig()
    cfg = parse_config(["--no-compile", "--lr", "3e-5", "--precision", "fp32"])
    assert cfg.lr == 3e-5 and cfg.run.precision == cfg.precision == "fp32"


def test_config_json_stays_flat_as_the_flags():
    # config.json and checkpoints record the run options beside the others, as before they were nested:
    # a checkpoint written before the nesting still compares its settings on resume.
    flat = parse_config(["--precision", "fp32", "--threads", "1"]).to_dict()
    assert flat["precision"] == "fp32" and flat["threads"] == 1 and "run" not in flat
    assert list(flat) == [a.dest for a in build_parser()._actions if a.dest != "help"]


@pytest.mark.parametrize("argv, fragment", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--lr", "0"], "--lr must be a positive number"),
    (["--warmup-ratio", "1"], "--warmup-ratio must be in [0, 1)"),
    (["--precision", "fp16"], "invalid choice: 'fp16'"),
    (["--max-steps", "-1"], "--max-steps must not be negative"),
])
def test_config_errors_are_one_line(argv, fragment):
    with pytest.raises(CoreCPUError) as err:
        parse_config(argv)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_make_data_writes_the_builtin_task_and_refuses_to_overwrite(tmp_path):
    import subprocess
    import sys

    from corecpu.data.sources import load_data

    path = tmp_path / "builtin.tsv"
    cmd = [sys.executable, "-m", "corecpu.cli", "make-data", str(path), "--n", "50"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    data = load_data(str(path))
    assert len(data) == 50 and data.label_names == ["negative", "positive"]
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "already exists" in again.stderr
