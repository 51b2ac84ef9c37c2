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
from corecpu.training.options import RunOptions, opt


@dataclass
class TrainConfig:
    # -- what to train on
    model: str = opt("default", "local Hugging Face model directory, 'default' (all-MiniLM-L6-v2, shipped "
                      "offline) or 'tiny' (small random BERT for tests)", metavar="PATH")
    data: str = opt("builtin", "training data: a .tsv/.csv/.jsonl file, or a built-in task: 'builtin' (generated "
                     "sentiment, ~15 tokens) or 'paraphrase' (sentence pairs, ~50 tokens, for benchmarks)",
                     metavar="PATH")
    eval_data: str = opt("auto", "evaluation data: a file, 'none' to skip evaluation, or 'auto' (the held-out split "
                          "of a built-in --data; none for a file)", metavar="PATH")
    data_format: str = opt("auto", "format of --data/--eval-data files; auto: from the extension",
                            choices=FORMAT_CHOICES)
    header: bool = opt(True, "TSV/CSV files start with a header line (--no-header: pick columns by index)")
    text_column: str = opt("", "column (name or 0-based index) holding the text; inferred when empty", metavar="COL")
    text_pair_column: str = opt("", "column holding the second sentence of a pair, if any", metavar="COL")
    label_column: str = opt("", "column holding the label; inferred when empty", metavar="COL")
    max_seq_len: int = opt(128, "truncate inputs to this many tokens (batches pad to their longest input)")
    group_by_length: bool = opt(True, "batch examples of similar length together (less padding; DDP-aware, "
                                 "deterministic from --seed)")
    pad_to_multiple_of: int = opt(0, "pad each batch's length up to a multiple of N (0: to its longest input); "
                                   "few distinct shapes help --compile")
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
    report_to: str = opt("none", "experiment trackers, comma-separated: none, tensorboard, mlflow, wandb",
                          metavar="LIST")
    progress: str = opt("auto", "rich progress bar on rank 0: auto (only on a terminal), on, off",
                         choices=("auto", "on", "off"))

    def validate(self) -> "TrainConfig":
        positive = ("batch_size", "grad_accum", "epochs", "max_seq_len", "log_every", "keep_checkpoints")
        for name in positive:
            if getattr(self, name) < 1:
                raise CoreCPUError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        for name in ("max_steps", "save_every", "max_grad_norm", "weight_decay", "pad_to_multiple_of"):
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
        for name in ("progress", "data_format"):
            choices = TrainConfig.__dataclass_fields__[name].metadata["choices"]
            if getattr(self, name) not in choices:
                raise CoreCPUError(f"--{name.replace('_', '-')} {getattr(self, name)!r} is not one of: {', '.join(choices)}")
        self.run.validate(flags=True)
        return self

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
    args = vars(build_parser(description).parse_args(argv))
    run = RunOptions(**{f.name: args.pop(f.name) for f in dataclasses.fields(RunOptions)})
    return TrainConfig(**args, run=run).validate()
