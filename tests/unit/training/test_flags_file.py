"""Tier 1: `--config FILE` (corecpu.training.flags_file): the flags' keys, flags win, a run's own
config.json reads back, and every bad file is one line that names the key or the problem."""

from __future__ import annotations

import json

import pytest

from corecpu.errors import CoreCPUError
from corecpu.tasks.registry import parse_config


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_yaml_keys_are_the_flags_and_flags_override(tmp_path):
    pytest.importorskip("yaml")
    path = write(tmp_path, "run.yaml", "model: tiny\nbatch-size: 8\nlr: 1\nprecision: fp32\ngroup_by_length: false\n")
    cfg = parse_config(["--config", path, "--lr", "5e-5"])
    assert (cfg.model, cfg.batch_size, cfg.lr, cfg.run.precision, cfg.group_by_length) == ("tiny", 8, 5e-5, "fp32", False)
    assert isinstance(parse_config(["--config", path]).lr, float)  # 1 in the file is the float 1.0
    # a flag given on the command line wins even when it says the default
    assert parse_config(["--config", path, "--batch-size", "16", "--group-by-length"]).batch_size == 16


def test_a_runs_config_json_reads_back_as_the_same_config(tmp_path):
    cfg = parse_config(["--model", "tiny", "--max-steps", "7", "--precision", "fp32", "--save-every", "3"])
    # what reporting/reporter.py writes: the flat flags, then what auto resolved to and why
    record = {**cfg.to_dict(), "resolved": {"precision": "fp32", "threads": 2}, "decisions": [{"what": "x"}]}
    path = write(tmp_path, "config.json", json.dumps(record))
    again = parse_config(["--config", path])
    assert again == cfg and again.to_dict() == cfg.to_dict()
    assert again != parse_config([])


@pytest.mark.parametrize("text, message", [
    ('{"bach_size": 8}', "unknown key 'bach_size'; keys are train.py's flags without '--'"),
    ('{"batch_size": "8"}', "batch_size must be a whole number, got '8'"),
    ('{"batch_size": true}', "batch_size must be a whole number, got True"),
    ('{"lr": "fast"}', "lr must be a number, got 'fast'"),
    ('{"compile": 1}', "compile must be true or false, got 1"),
    ('[1, 2]', "expected a mapping of flag names to values, got list"),
    ('{"lr": ', "not valid JSON at line 1"),
])
def test_bad_json_is_one_line(tmp_path, text, message):
    path = write(tmp_path, "c.json", text)
    with pytest.raises(CoreCPUError) as err:
        parse_config(["--config", path])
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert str(err.value).startswith(f"--config {path}: ")


def test_missing_file_and_unknown_type(tmp_path):
    with pytest.raises(CoreCPUError, match="cannot read it"):
        parse_config(["--config", str(tmp_path / "nope.json")])
    with pytest.raises(CoreCPUError, match=r"unknown file type \.toml; use \.yaml, \.yml or \.json"):
        parse_config(["--config", write(tmp_path, "c.toml", "lr = 1")])


def test_bad_yaml_names_the_line(tmp_path):
    pytest.importorskip("yaml")
    with pytest.raises(CoreCPUError, match=r"not valid YAML at line \d"):
        parse_config(["--config", write(tmp_path, "c.yaml", "model: tiny\nlr: [1\n")])


def test_values_from_the_file_are_validated_like_flags(tmp_path):
    with pytest.raises(CoreCPUError, match="--batch-size must be at least 1, got -2"):
        parse_config(["--config", write(tmp_path, "c.json", '{"batch_size": -2}')])
    with pytest.raises(CoreCPUError, match="--progress 'sometimes' is not one of"):
        parse_config(["--config", write(tmp_path, "c.json", '{"progress": "sometimes"}')])
