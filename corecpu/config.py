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

from corecpu.errors import CoreCPUError


def _opt(default: Any, help: str, choices: tuple[str, ...] | None = None, metavar: str | None = None) -> Any:
    return field(default=default, metadata={"help": help, "choices": choices, "metavar": metavar})


@dataclass
class TrainConfig:
    # -- what to train on
    model: str = _opt("default", "local Hugging Face model directory, 'default' (all-MiniLM-L6-v2, shipped "
                      "offline) or 'tiny' (small random BERT for tests)", metavar="PATH")
    data: str = _opt("builtin", "training data: a .tsv/.csv/.jsonl file, or a built-in task: 'builtin' (generated "
                     "sentiment, ~15 tokens) or 'paraphrase' (sentence pairs, ~50 tokens, for benchmarks)",
                     metavar="PATH")
    eval_data: str = _opt("auto", "evaluation data: a file, 'none' to skip evaluation, or 'auto' (the held-out split "
                          "of a built-in --data; none for a file)", metavar="PATH")
    data_format: str = _opt("auto", "format of --data/--eval-data files; auto: from the extension",
                            choices=("auto", "tsv", "csv", "jsonl"))
    header: bool = _opt(True, "TSV/CSV files start with a header line (--no-header: pick columns by index)")
    text_column: str = _opt("", "column (name or 0-based index) holding the text; inferred when empty", metavar="COL")
    text_pair_column: str = _opt("", "column holding the second sentence of a pair, if any", metavar="COL")
    label_column: str = _opt("", "column holding the label; inferred when empty", metavar="COL")
    max_seq_len: int = _opt(128, "truncate inputs to this many tokens (batches pad to their longest input)")
    group_by_length: bool = _opt(True, "batch examples of similar length together (less padding; DDP-aware, "
                                 "deterministic from --seed)")
    pad_to_multiple_of: int = _opt(0, "pad each batch's length up to a multiple of N (0: to its longest input); "
                                   "few distinct shapes help --compile")
    # -- optimisation
    batch_size: int = _opt(16, "examples per rank per micro-step (global batch = this x ranks x --grad-accum)")
    grad_accum: int = _opt(1, "micro-steps per optimizer step; gradients sync only on the last one")
    lr: float = _opt(1e-4, "peak learning rate of AdamW")
    weight_decay: float = _opt(0.01, "AdamW weight decay (not applied to biases and LayerNorm)")
    warmup_ratio: float = _opt(0.1, "fraction of optimizer steps spent warming up linearly, then linear decay to 0")
    max_grad_norm: float = _opt(1.0, "clip the global gradient norm to this (0 disables clipping)")
    epochs: int = _opt(3, "passes over the training data")
    max_steps: int = _opt(0, "stop after this many optimizer steps (0: run all epochs)")
    seed: int = _opt(0, "base random seed; rank r uses seed + r where randomness must differ")
    # -- how to run
    precision: str = _opt("auto", "auto: bf16 autocast if the CPU has AMX or bf16 measured >= 1.1x fp32 "
                          "for this model (timed once per CPU, cached in ~/.cache/corecpu), else fp32",
                          choices=("auto", "fp32", "bf16"))
    backend: str = _opt("auto", "auto: ccl if oneccl_bindings_for_pytorch matches torch, else gloo",
                        choices=("auto", "gloo", "ccl", "mpi"))
    allreduce: str = _opt("auto", "gradient all-reduce: auto (Intel MPI's shared-memory collectives via mpi4py when "
                          "the ranks were started by MPI, else gloo), gloo, mpi", choices=("auto", "gloo", "mpi"))
    compile: bool = _opt(False, "apply torch.compile to the model (measured: no faster than eager for "
                         "MiniLM on CPU, plus ~1 min of compiling per new shape; benchmarks/README.md)")
    ipex: str = _opt("auto", "auto: ipex.optimize when intel_extension_for_pytorch matches torch; off: never",
                     choices=("auto", "off"))
    threads: int = _opt(0, "compute threads per rank (0: this rank's cores, as bound by the launcher or planned here)")
    dist_timeout: float = _opt(120.0, "seconds to wait for all ranks at start-up before failing with a clear error")
    step_timeout: float = _opt(300.0, "after the first step, seconds without progress from any rank before the job "
                               "ends naming the ranks that stopped (raised to several times the slowest step seen)")
    # -- output
    output_dir: str = _opt("runs/default", "where metrics.jsonl, checkpoints/ and final/ go", metavar="DIR")
    log_every: int = _opt(10, "log one line and one metrics.jsonl record every N optimizer steps")
    save_every: int = _opt(0, "write a checkpoint every N optimizer steps (0: only at the end)")
    keep_checkpoints: int = _opt(2, "keep the newest K checkpoints")
    resume: str = _opt("", "'auto': continue from the newest complete checkpoint in --output-dir; or a checkpoint dir",
                       metavar="auto|DIR")
    report_to: str = _opt("none", "experiment trackers, comma-separated: none, tensorboard, mlflow, wandb",
                          metavar="LIST")
    progress: str = _opt("auto", "rich progress bar on rank 0: auto (only on a terminal), on, off",
                         choices=("auto", "on", "off"))

    def validate(self) -> "TrainConfig":
        positive = ("batch_size", "grad_accum", "epochs", "max_seq_len", "log_every", "keep_checkpoints")
        for name in positive:
            if getattr(self, name) < 1:
                raise CoreCPUError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        for name in ("max_steps", "save_every", "threads", "max_grad_norm", "weight_decay", "pad_to_multiple_of"):
            if getattr(self, name) < 0:
                raise CoreCPUError(f"--{name.replace('_', '-')} must not be negative, got {getattr(self, name)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise CoreCPUError(f"--lr must be a positive number, got {self.lr}")
        if not 0 <= self.warmup_ratio < 1:
            raise CoreCPUError(f"--warmup-ratio must be in [0, 1), got {self.warmup_ratio}")
        for name in ("dist_timeout", "step_timeout"):
            if not getattr(self, name) > 0:
                raise CoreCPUError(f"--{name.replace('_', '-')} must be positive seconds, got {getattr(self, name)}")
        for name in ("precision", "backend", "ipex", "progress", "allreduce", "data_format"):
            choices = TrainConfig.__dataclass_fields__[name].metadata["choices"]
            if getattr(self, name) not in choices:
                raise CoreCPUError(f"--{name} {getattr(self, name)!r} is not one of: {', '.join(choices)}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class _OneLineErrorParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise CoreCPUError(f"{message}; see --help")


def build_parser(description: str = "") -> argparse.ArgumentParser:
    parser = _OneLineErrorParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in dataclasses.fields(TrainConfig):
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
    args = build_parser(description).parse_args(argv)
    return TrainConfig(**vars(args)).validate()
