"""Tier 1: the configuration surface (corecpu.config) and the `corecpu make-data` command."""

from __future__ import annotations

import pytest

from corecpu.config import TrainConfig, build_parser, parse_config
from corecpu.errors import CoreCPUError


def test_every_config_field_is_a_flag_with_help():
    parser = build_parser()
    text = parser.format_help()
    for name, f in TrainConfig.__dataclass_fields__.items():
        assert "--" + name.replace("_", "-") in text and f.metadata["help"]
    assert parse_config([]) == TrainConfig()
    assert parse_config(["--no-compile", "--lr", "3e-5"]).lr == 3e-5


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

    from corecpu.data import load_data

    path = tmp_path / "builtin.tsv"
    cmd = [sys.executable, "-m", "corecpu.cli", "make-data", str(path), "--n", "50"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    data = load_data(str(path))
    assert len(data) == 50 and data.label_names == ["negative", "positive"]
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "already exists" in again.stderr
