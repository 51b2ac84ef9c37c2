"""Tier 1: the configuration surface (corecpu.training.train_config, its task sections from corecpu.tasks.registry)
and the `corecpu make-data` command."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import pytest

from corecpu.errors import CoreCPUError
from corecpu.tasks.causal_lm import CausalLMOptions
from corecpu.tasks.classification import ClassificationOptions
from corecpu.tasks.qa import QAOptions
from corecpu.tasks.registry import build_parser, parse_config
from corecpu.training import train_config as config
from corecpu.training.train_config import TaskOptions, TrainConfig
from corecpu.training.run_options import RunOptions, opt


def test_every_config_field_is_a_flag_with_help():
    text = build_parser().format_help()
    shared = [f for f in dataclasses.fields(TrainConfig) if f.name not in ("run", "task_options")]
    sections = list(dataclasses.fields(ClassificationOptions)) + list(dataclasses.fields(QAOptions))
    for f in shared + list(dataclasses.fields(RunOptions)) + sections:
        assert "--" + f.name.replace("_", "-") in text and f.metadata["help"]
    assert "--task qa (extractive question answering" in text and "(default: 128)" in text  # a group per task
    assert parse_config([]) == parse_config([])
    cfg = parse_config(["--no-compile", "--lr", "3e-5", "--precision", "fp32"])
    assert cfg.lr == 3e-5 and cfg.run.precision == "fp32"
    with pytest.raises(AttributeError):
        cfg.precision  # noqa: B018 - the run options are cfg.run's, not forwarded


def test_config_json_stays_flat_as_the_flags():
    # config.json and checkpoints record the run options and the task's options beside the others, as before
    # they were nested: a checkpoint written before the nesting still compares its settings on resume.
    flat = parse_config(["--precision", "fp32", "--threads", "1", "--label-column", "y"]).to_dict()
    assert flat["precision"] == "fp32" and flat["threads"] == 1 and flat["label_column"] == "y"
    assert "run" not in flat and "task_options" not in flat and "doc_stride" not in flat
    others = ({f.name for f in dataclasses.fields(QAOptions)} | {f.name for f in dataclasses.fields(CausalLMOptions)}) - {
        f.name for f in dataclasses.fields(ClassificationOptions)}
    assert set(flat) == {a.dest for a in build_parser()._actions if a.dest != "help"} - others
    qa = parse_config(["--task", "qa", "--doc-stride", "64"]).to_dict()
    assert qa["doc_stride"] == 64 and "label_column" not in qa


def test_a_config_json_from_before_the_sections_reads_for_either_task(tmp_path):
    # Before the sections config.json recorded every task's options; at their defaults they are no setting.
    path = tmp_path / "config.json"
    for argv, other in (([], QAOptions()), (["--task", "qa", "--doc-stride", "64"], ClassificationOptions())):
        cfg = parse_config(argv)
        path.write_text(json.dumps({**cfg.to_dict(), **dataclasses.asdict(other), "resolved": {}, "decisions": []}))
        assert parse_config(["--config", str(path)]) == cfg
    old = {**parse_config([]).to_dict(), **dataclasses.asdict(QAOptions()), "doc_stride": 64}
    path.write_text(json.dumps(old))
    with pytest.raises(CoreCPUError, match="^--doc-stride applies to --task qa, not to --task classification; "):
        parse_config(["--config", str(path)])


@pytest.mark.parametrize("argv, fragment", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--lr", "-1"], "--lr must be a positive number"),
    (["--task", "causal-lm", "--data-format", "tsv"], "--data-format 'tsv' is not one of: auto, txt, jsonl, json"),
    (["--task", "causal-lm", "--lora-r", "-2"], "--lora-r must be a positive rank"),
    (["--task", "causal-lm", "--merge-lora"], "--merge-lora needs LoRA; pass --lora-r"),
    (["--warmup-ratio", "1"], "--warmup-ratio must be in [0, 1)"),
    (["--precision", "fp16"], "invalid choice: 'fp16'"),
    (["--max-steps", "-1"], "--max-steps must not be negative"),
    (["--data-format", "xml"], "invalid choice: 'xml'"),
])
def test_config_errors_are_one_line(argv, fragment):
    with pytest.raises(CoreCPUError) as err:
        parse_config(argv)
    assert fragment in str(err.value) and "\n" not in str(err.value)


# ---------------------------------------------------------------- sections, without the real tasks

@dataclass(frozen=True)
class _Words(TaskOptions):
    summary = "count words"
    default_data = "words.txt"
    column: str = opt("text", "the column", metavar="COL")
    window: int = opt(8, "words per window")


@dataclass(frozen=True)
class _Letters(TaskOptions):
    summary = "count letters"
    default_max_seq_len = 64
    window: int = opt(3, "letters per window")  # the same flag as _Words', its own default


SECTIONS = {"words": _Words, "letters": _Letters}


def test_the_task_list_and_sections_come_from_the_caller():
    words = config.parse_config(["--task", "words", "--column", "body"], SECTIONS)
    assert words.task_options == _Words(column="body") and (words.data, words.max_seq_len) == ("words.txt", 128)
    letters = config.parse_config(["--task", "letters"], SECTIONS)
    assert letters.task_options == _Letters(window=3) and letters.max_seq_len == 64  # its own window default
    assert config.parse_config(["--task", "letters", "--window", "5"], SECTIONS).task_options.window == 5
    with pytest.raises(CoreCPUError, match="^--column applies to --task words, not to --task letters; drop it"):
        config.parse_config(["--task", "letters", "--column", "x"], SECTIONS)
    with pytest.raises(CoreCPUError, match="invalid choice: 'qa'"):
        config.parse_config(["--task", "qa"], SECTIONS)
    with pytest.raises(CoreCPUError, match="options section"):
        TrainConfig().validate()  # built by hand without one


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


def test_run_defining_settings_come_from_where_they_are_declared():
    from corecpu.training.checkpoint_state import config_changes

    shared = {"task", "model", "data", "eval_data", "batch_size", "grad_accum", "lr", "weight_decay", "warmup_ratio",
              "max_grad_norm", "epochs", "max_steps", "seed", "max_seq_len", "precision", "allreduce_dtype", "dropout"}
    classification = parse_config([]).run_defining()
    qa = parse_config(["--task", "qa"]).run_defining()
    assert set(classification) == shared | {"text_column", "text_pair_column", "label_column"}
    assert set(qa) == shared | {"version_2_with_negative", "doc_stride", "id_column", "question_column",
                                "context_column", "answers_column"}
    # A QA window setting changed since the checkpoint is named; how answers are picked (n_best) is not.
    saved = parse_config(["--task", "qa"]).to_dict()
    now = parse_config(["--task", "qa", "--doc-stride", "64", "--n-best-size", "5"]).to_dict()
    assert config_changes(saved, now, qa) == ["doc_stride: 128 -> 64"]
