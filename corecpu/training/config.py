"""Training configuration: one dataclass of defaults, one help string per field.

The command line is generated from the dataclass, so a flag cannot exist
without a default and a help text, and `validate()` checks the combination
once, at the edge, before any process group or model exists.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from corecpu.data.files import FORMAT_CHOICES
from corecpu.errors import CoreCPUError
from corecpu.training.config_file import read_config_file
from corecpu.training.options import RunOptions, opt


# The jobs train.py knows (corecpu.tasks.TASKS maps each to its module) and what a task changes in
# the defaults: QA windows are 384 tokens with a 128-token stride, as run_qa.py trains SQuAD.
TASK_NAMES = ("classification", "qa")
DEFAULT_MAX_SEQ_LEN = {"classification": 128, "qa": 384}


@dataclass
class TrainConfig:
    # -- what to train on
    task: str = opt("classification", "what to train: classification (sequence classification, e.g. MRPC) or qa "
                     "(extractive question answering, SQuAD as run_qa.py trains it)", choices=TASK_NAMES)
    model: str = opt("default", "local Hugging Face model directory, 'default' (all-MiniLM-L6-v2, shipped "
                      "offline) or 'tiny' (small random BERT for tests)", metavar="PATH")
    data: str = opt("", "training data: a .tsv/.csv/.jsonl file, a Parquet/Arrow file or save_to_disk directory, "
                     "or a built-in set: 'builtin' (generated sentiment, ~15 tokens; the classification default), "
                     "'paraphrase' (sentence pairs, ~50 tokens, for benchmarks) or 'qa' (generated SQuAD-style "
                     "questions, ~300-token contexts; the qa default). For --task qa: a SQuAD .json (v1.1/v2.0) or "
                     "flat rows (id, question, context, answers)", metavar="PATH")
    eval_data: str = opt("auto", "evaluation data: a file, 'none' to skip evaluation, or 'auto' (the held-out split "
                          "of a built-in --data; none for a file)", metavar="PATH")
    data_format: str = opt("auto", "format of --data/--eval-data files; auto: from the extension",
                            choices=FORMAT_CHOICES)
    header: bool = opt(True, "TSV/CSV files start with a header line (--no-header: pick columns by index)")
    text_column: str = opt("", "column (name or 0-based index) holding the text; inferred when empty", metavar="COL")
    text_pair_column: str = opt("", "column holding the second sentence of a pair, if any", metavar="COL")
    label_column: str = opt("", "column holding the label; inferred when empty", metavar="COL")
    max_seq_len: int = opt(0, "truncate inputs to this many tokens (batches pad to their longest input); 0: the "
                            "task's default, 128 for classification, 384 for qa (longer contexts become windows)")
    group_by_length: bool = opt(True, "batch examples of similar length together (less padding; DDP-aware, "
                                 "deterministic from --seed)")
    pad_to_multiple_of: int = opt(0, "pad each batch's length up to a multiple of N (0: to its longest input); "
                                   "few distinct shapes help --compile")
    # -- question answering (--task qa)
    version_2_with_negative: bool = opt(False, "SQuAD v2.0: questions without an answer are expected (trained to "
                                         "the CLS token, scored as v2.0); without it an empty answer is an error")
    doc_stride: int = opt(128, "tokens of overlap between the windows of a context longer than --max-seq-len")
    n_best_size: int = opt(20, "start and end candidates per window when picking the answer span")
    max_answer_length: int = opt(30, "longest answer span considered, in tokens")
    null_score_diff_threshold: float = opt(0.0, "v2.0: answer \"\" when the no-answer score beats the best span "
                                            "by more than this")
    id_column: str = opt("id", "flat QA data: the column holding the question id", metavar="COL")
    question_column: str = opt("question", "flat QA data: the column holding the question", metavar="COL")
    context_column: str = opt("context", "flat QA data: the column holding the context", metavar="COL")
    answers_column: str = opt("answers", "flat QA data: the column holding {text: [...], answer_start: [...]}",
                              metavar="COL")
    # -- optimisation
    batch_size: int = opt(16, "examples per rank per micro-step (global batch = this x ranks x --grad-accum)")
    grad_accum: int = opt(1, "micro-steps per optimizer step; gradients sync only on the last one")
    lr: float = opt(1e-4, "peak learning rate of AdamW")
    weight_decay: float = opt(0.01, "AdamW weight decay (not applied to biases and LayerNorm)")
    warmup_ratio: float = opt(0.1, "fraction of optimizer steps spent warming up linearly, then linear decay to 0")
    max_grad_norm: float = opt(1.0, "clip the global gradient norm to this (0 disables clipping)")
    epochs: int = opt(3, "passes over the training data")
    max_steps: int = opt(0, "stop after this many optimizer steps (0: run all epochs)")
    seed: int = opt(0, "base random seed; rank r uses seed + r where randomness must differ")
    # -- how to run: the options corecpu.setup() takes (flat on the command line and in config.json)
    run: RunOptions = field(default_factory=RunOptions)
    # -- output
    output_dir: str = opt("runs/default", "where metrics.jsonl, checkpoints/ and final/ go", metavar="DIR")
    log_every: int = opt(10, "log one line and one metrics.jsonl record every N optimizer steps")
    save_every: int = opt(0, "write a checkpoint every N optimizer steps (0: only at the end)")
    keep_checkpoints: int = opt(2, "keep the newest K checkpoints")
    resume: str = opt("", "'auto': continue from the newest complete checkpoint in --output-dir; or a checkpoint dir",
                       metavar="auto|DIR")
    resume_approximate: bool = opt(False, "resume even when ranks x --batch-size x --grad-accum differ from the "
                                    "checkpoint's; the position in the epoch is then approximate (the start-up says "
                                    "how many examples are skipped or repeated)")
    report_to: str = opt("none", "experiment trackers, comma-separated: none, tensorboard, mlflow, wandb",
                          metavar="LIST")
    progress: str = opt("auto", "rich progress bar on rank 0: auto (only on a terminal), on, off",
                         choices=("auto", "on", "off"))

    def __post_init__(self) -> None:
        # The task's defaults, resolved at once so that config.json and checkpoints record real values.
        if self.task in TASK_NAMES:
            self.data = self.data or ("qa" if self.task == "qa" else "builtin")
            self.max_seq_len = self.max_seq_len or DEFAULT_MAX_SEQ_LEN[self.task]

    def validate(self) -> "TrainConfig":
        if self.task not in TASK_NAMES:
            raise CoreCPUError(f"--task {self.task!r} is not one of: {', '.join(TASK_NAMES)}")
        positive = ("batch_size", "grad_accum", "epochs", "max_seq_len", "log_every", "keep_checkpoints",
                    "n_best_size", "max_answer_length")
        for name in positive:
            if getattr(self, name) < 1:
                raise CoreCPUError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        for name in ("max_steps", "save_every", "max_grad_norm", "weight_decay", "pad_to_multiple_of", "doc_stride"):
            if getattr(self, name) < 0:
                raise CoreCPUError(f"--{name.replace('_', '-')} must not be negative, got {getattr(self, name)}")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):  # nan slips past every < and > check
                raise CoreCPUError(f"--{f.name.replace('_', '-')} must be a finite number, got {value}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise CoreCPUError(f"--lr must be a positive number, got {self.lr}")
        if not 0 <= self.warmup_ratio < 1:
            raise CoreCPUError(f"--warmup-ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.task == "qa" and self.doc_stride >= self.max_seq_len:
            raise CoreCPUError(f"--doc-stride {self.doc_stride} must be below --max-seq-len {self.max_seq_len} "
                               "(windows overlap by the stride); use e.g. --doc-stride 128 with 384")
        self._check_task_flags()
        for name in ("task", "progress", "data_format"):
            choices = TrainConfig.__dataclass_fields__[name].metadata["choices"]
            if getattr(self, name) not in choices:
                raise CoreCPUError(f"--{name.replace('_', '-')} {getattr(self, name)!r} is not one of: {', '.join(choices)}")
        self.run.validate(flags=True)
        return self

    def _check_task_flags(self) -> None:
        """A flag of the other task is a mistake worth one line, not a silently ignored setting."""
        qa_only = ("version_2_with_negative", "doc_stride", "n_best_size", "max_answer_length",
                   "null_score_diff_threshold", "id_column", "question_column", "context_column", "answers_column")
        classification_only = ("text_column", "text_pair_column", "label_column", "data_format", "header")
        other = qa_only if self.task == "classification" else classification_only
        defaults = TrainConfig.__dataclass_fields__
        for name in other:
            if getattr(self, name) != defaults[name].default:
                flag = "--" + name.replace("_", "-")
                raise CoreCPUError(f"{flag} applies to --task {'qa' if self.task == 'classification' else 'classification'}, "
                                   f"not to --task {self.task}; drop it or pass the other --task")

    def to_dict(self) -> dict[str, Any]:
        """Flat, as on the command line: what config.json and checkpoints record (and compare on resume)."""
        return {f.name: getattr(self, f.name) for f in _flat_fields()}

    def __getattr__(self, name: str) -> Any:
        # cfg.precision, cfg.backend, ...: the nested run options read as flat, like their flags.
        if name != "run" and name in RunOptions.__dataclass_fields__:
            return getattr(self.run, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


class _OneLineErrorParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise CoreCPUError(f"{message}; see --help")


def _flat_fields() -> list[dataclasses.Field]:
    """TrainConfig's fields with the run options in the place of `run`: the flags, in --help order."""
    out: list[dataclasses.Field] = []
    for f in dataclasses.fields(TrainConfig):
        out += list(dataclasses.fields(RunOptions)) if f.name == "run" else [f]
    return out


def build_parser(description: str = "") -> argparse.ArgumentParser:
    parser = _OneLineErrorParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in _flat_fields():
        flag = "--" + f.name.replace("_", "-")
        meta = f.metadata
        if f.type in ("bool", bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=meta["help"])
            continue
        kind = {"int": int, "float": float, "str": str}[f.type if isinstance(f.type, str) else f.type.__name__]
        parser.add_argument(flag, type=kind, default=f.default, help=meta["help"], choices=meta["choices"],
                            metavar=meta["metavar"])
    return parser


def parse_config(argv: list[str] | None = None, description: str = "") -> TrainConfig:
    parser = build_parser(description)
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="YAML or JSON file of flag values (keys as the flags, e.g. batch_size: 8); flags given "
                        "here override it; a run's config.json reads back")
    args = vars(parser.parse_args(argv))
    if args["config"]:  # the file sets defaults, so the command line still wins
        fields = {f.name: f.type if isinstance(f.type, str) else f.type.__name__ for f in _flat_fields()}
        parser.set_defaults(**read_config_file(args["config"], fields))
        args = vars(parser.parse_args(argv))
    args.pop("config")
    run = RunOptions(**{f.name: args.pop(f.name) for f in dataclasses.fields(RunOptions)})
    return TrainConfig(**args, run=run).validate()
