"""Training configuration: the settings every task shares, and the command line built from them.

One dataclass of defaults with one help string per field (`TrainConfig`), the run options nested
as `cfg.run` (corecpu.training.run_options), and the chosen task's own options nested as
`cfg.task_options`: a small `TaskOptions` dataclass that each task defines in its own module
(corecpu.tasks.qa.QAOptions, ...). This module knows no task by name: the registry
(corecpu.tasks.registry) passes the sections down, `{task name: its TaskOptions class}`.

The command line and config.json stay flat (`--doc-stride`, "doc_stride"). `parse_config` puts
each value where it belongs; a flag of another task's section has no place in this run's
configuration and is refused in one line. `validate()` checks the combination once, at the
edge, before any process group or model exists.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from corecpu.errors import CoreCPUError
from corecpu.training.best_metric import BestMetric, check_known
from corecpu.training.flags_file import read_config_file
from corecpu.training.run_options import RunOptions, opt

Sections = Mapping[str, "type[TaskOptions]"]  # --task name -> its options class, from corecpu.tasks.registry


def flag(name: str) -> str:
    """The command-line spelling of a field: doc_stride -> --doc-stride."""
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class TaskOptions:
    """A task's own options, nested in TrainConfig as `cfg.task_options`: subclass it with opt() fields.

    Each field is a flag and a config.json key exactly as a shared setting is (doc_stride is
    --doc-stride); the class variables say what the task is and what it changes in the shared defaults.
    """

    summary: ClassVar[str] = ""  # what --task NAME trains, one phrase for --help
    default_data: ClassVar[str] = "builtin"  # --data when none is given
    default_max_seq_len: ClassVar[int] = 128  # --max-seq-len when 0
    default_model: ClassVar[str] = "default"  # what --model default means (MiniLM unless the task says)
    default_lr: ClassVar[float] = 1e-4  # --lr when 0
    default_batch_size: ClassVar[int] = 16  # --batch-size when 0
    default_epochs: ClassVar[int] = 3  # --epochs when 0
    eval_metrics: ClassVar[tuple[str, ...]] = ()  # what evaluate() may report, for --keep-best; () = not declared

    def lr_for(self, cfg: TrainConfig) -> float:
        """--lr when it is 0: the task's default for the model (and adapter) in `cfg`."""
        return self.default_lr

    def validate(self, cfg: TrainConfig) -> None:
        """Raise one CoreCPUError line naming the flag for the first bad option; cfg holds the shared settings.
        Choices and finiteness are checked for every section already."""


@dataclass
class TrainConfig:
    # -- what to train on
    task: str = opt("classification", "what to train",
                    defines_run=True)  # the choices and their help: the sections passed in
    model: str = opt("default", "local Hugging Face model directory, 'default' (the task's: all-MiniLM-L6-v2, "
                      "shipped offline, for classification and qa; llama-tiny for causal-lm), 'tiny' (small random "
                      "BERT for tests), or a built-in causal LM built at first use: 'llama-tiny' (a few million "
                      "parameters) or 'llama-135m' (SmolLM-135M's shapes), random weights", metavar="PATH",
                     defines_run=True)
    data: str = opt("", "training data: a .tsv/.csv/.jsonl file, a Parquet/Arrow file or save_to_disk directory, "
                     "or a built-in set: 'builtin' (generated sentiment, ~15 tokens; the classification default), "
                     "'paraphrase' (sentence pairs, ~50 tokens, for benchmarks) or 'qa' (generated SQuAD-style "
                     "questions, ~300-token contexts; the qa default). For --task qa: a SQuAD .json (v1.1/v2.0) or "
                     "flat rows (id, question, context, answers). For --task causal-lm: .txt (a document per line), .jsonl, "
                     "Parquet/Arrow or a save_to_disk directory with text, prompt/completion or messages columns, or "
                     "'sft' (the built-in instruction set; its default)", metavar="PATH", defines_run=True)
    eval_data: str = opt("auto", "evaluation data: a file, 'none' to skip evaluation, or 'auto' (the held-out split "
                          "of a built-in --data; none for a file)", metavar="PATH", defines_run=True)
    max_seq_len: int = opt(0, "truncate inputs to this many tokens (batches pad to their longest input; longer "
                            "QA contexts become windows); 0: the task's default", defines_run=True)
    group_by_length: bool = opt(True, "batch examples of similar length together (less padding; DDP-aware, "
                                 "deterministic from --seed)")
    pad_to_multiple_of: int = opt(0, "pad each batch's length up to a multiple of N (0: to its longest input); "
                                   "few distinct shapes help --compile")
    # -- the chosen task's own options (flat on the command line and in config.json, like the run options)
    task_options: TaskOptions | None = None
    # -- optimisation
    batch_size: int = opt(0, "examples per rank per micro-step (global batch = this x ranks x --grad-accum); 0: the "
                          "task's default (16; causal-lm 4 packed rows)", defines_run=True)
    grad_accum: int = opt(1, "micro-steps per optimizer step; gradients sync only on the last one", defines_run=True)
    lr: float = opt(0.0, "peak learning rate of AdamW; 0: the task's default (1e-4; causal-lm 1e-3 for its built-in "
                          "random model, 2e-5 for a --model directory, 2e-4 with --lora-r)", defines_run=True)
    weight_decay: float = opt(0.01, "AdamW weight decay (not applied to biases and LayerNorm)", defines_run=True)
    warmup_ratio: float = opt(0.1, "fraction of optimizer steps spent warming up linearly, then linear decay to 0",
                              defines_run=True)
    max_grad_norm: float = opt(1.0, "clip the global gradient norm to this (0 disables clipping)", defines_run=True)
    epochs: int = opt(0, "passes over the training data; 0: the task's default (3; causal-lm 8)", defines_run=True)
    max_steps: int = opt(0, "stop after this many optimizer steps (0: run all epochs)", defines_run=True)
    seed: int = opt(0, "base random seed; rank r uses seed + r where randomness must differ", defines_run=True)
    # -- how to run: the options corecpu.setup() takes (flat on the command line and in config.json)
    run: RunOptions = field(default_factory=RunOptions)
    # -- output
    output_dir: str = opt("runs/default", "where metrics.jsonl, checkpoints/ and final/ go", metavar="DIR")
    log_every: int = opt(10, "log one line and one metrics.jsonl record every N optimizer steps")
    eval_steps: int = opt(0, "evaluate every N optimizer steps (0: at the end of each epoch); always at the last step")
    save_every: int = opt(0, "write a checkpoint every N optimizer steps (0: only at the end)")
    keep_checkpoints: int = opt(2, "keep the newest K checkpoints")
    keep_best: str = opt("", "also save the checkpoint of the best evaluation by this metric (as in metrics.jsonl: "
                          "eval_loss, eval_accuracy, eval_f1, ...; lowest wins for losses and perplexity, highest "
                          "otherwise, or say :min / :max) and keep it beside the newest --keep-checkpoints",
                          metavar="METRIC")
    resume: str = opt("", "'auto': continue from the newest complete checkpoint in --output-dir; or a checkpoint dir",
                       metavar="auto|DIR")
    resume_approximate: bool = opt(False, "resume even when ranks x --batch-size x --grad-accum differ from the "
                                    "checkpoint's; the position in the epoch is then approximate (the start-up says "
                                    "how many examples are skipped or repeated)")
    report_to: str = opt("none", "experiment trackers, comma-separated: none, tensorboard, mlflow, wandb; or all "
                          "(every one installed)",
                          metavar="LIST")
    progress: str = opt("auto", "rich progress bar on rank 0: auto (only on a terminal), on, off",
                         choices=("auto", "on", "off"))

    def __post_init__(self) -> None:
        # The task's defaults, resolved at once so that config.json and checkpoints record real values.
        if self.task_options is not None:
            self.data = self.data or self.task_options.default_data
            self.max_seq_len = self.max_seq_len or self.task_options.default_max_seq_len
            if self.model == "default":
                self.model = self.task_options.default_model
            self.lr = self.lr or self.task_options.lr_for(self)
            self.batch_size = self.batch_size or self.task_options.default_batch_size
            self.epochs = self.epochs or self.task_options.default_epochs

    def validate(self) -> TrainConfig:
        if self.task_options is None:
            raise CoreCPUError(f"--task {self.task}: the configuration has no options section for it; build it with "
                               "corecpu.tasks.registry.parse_config")
        for name in ("batch_size", "grad_accum", "epochs", "max_seq_len", "log_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise CoreCPUError(f"{flag(name)} must be at least 1, got {getattr(self, name)}")
        for name in ("max_steps", "eval_steps", "save_every", "max_grad_norm", "weight_decay", "pad_to_multiple_of"):
            if getattr(self, name) < 0:
                raise CoreCPUError(f"{flag(name)} must not be negative, got {getattr(self, name)}")
        for owner in (self, self.task_options):
            for f in dataclasses.fields(owner):
                value, choices = getattr(owner, f.name), f.metadata.get("choices")
                if isinstance(value, float) and not math.isfinite(value):  # nan slips past every < and > check
                    raise CoreCPUError(f"{flag(f.name)} must be a finite number, got {value}")
                if choices and value not in choices:
                    raise CoreCPUError(f"{flag(f.name)} {value!r} is not one of: {', '.join(choices)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise CoreCPUError(f"--lr must be a positive number, got {self.lr}")
        if not 0 <= self.warmup_ratio < 1:
            raise CoreCPUError(f"--warmup-ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.keep_best:
            if self.eval_data == "none":
                raise CoreCPUError(f"--keep-best {self.keep_best} needs evaluations; drop --eval-data none or "
                                   "--keep-best")
            check_known(BestMetric.parse(self.keep_best), self.task_options.eval_metrics, self.task)
        self.task_options.validate(self)
        self.run.validate(flags=True)
        return self

    def run_defining(self) -> tuple[str, ...]:
        """The settings (flat names) whose change makes a resumed run another run: marked `defines_run` where
        they are declared, here, in RunOptions and in the task's section. Checkpoints compares them on resume."""
        owners = (self, self.run, self.task_options)
        return tuple(f.name for owner in owners if owner is not None for f in dataclasses.fields(owner)
                     if f.metadata.get("defines_run"))

    def to_dict(self) -> dict[str, Any]:
        """Flat, as on the command line: what config.json and checkpoints record (and compare on resume).
        The run options and this task's options sit in the places of `run` and `task_options`."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("run", "task_options"):
                out.update({g.name: getattr(value, g.name) for g in dataclasses.fields(value)} if value else {})
            else:
                out[f.name] = value
        return out


# ---------------------------------------------------------------- the command line


class _OneLineErrorParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise CoreCPUError(f"{message}; see --help")


def _shared_fields() -> list[dataclasses.Field]:
    """TrainConfig's fields with the run options in the place of `run`: the shared flags, in --help order."""
    out: list[dataclasses.Field] = []
    for f in dataclasses.fields(TrainConfig):
        if f.name != "task_options":
            out += list(dataclasses.fields(RunOptions)) if f.name == "run" else [f]
    return out


def _owners(sections: Sections) -> dict[str, list[str]]:
    """{option: the tasks whose section has it}; two tasks may share a flag (each with its own default)."""
    owners: dict[str, list[str]] = {}
    for task, section in sections.items():
        for f in dataclasses.fields(section):
            owners.setdefault(f.name, []).append(task)
    return owners


def _kind(f: dataclasses.Field) -> str:
    return f.type if isinstance(f.type, str) else f.type.__name__


def _add(parser: argparse.ArgumentParser | argparse._ArgumentGroup, f: dataclasses.Field, **override: Any) -> None:
    meta = {"choices": f.metadata["choices"], "metavar": f.metadata["metavar"], "help": f.metadata["help"],
            "default": f.default, **override}
    if _kind(f) == "bool":
        parser.add_argument(flag(f.name), action=argparse.BooleanOptionalAction, default=meta["default"],
                            help=meta["help"])
        return
    parser.add_argument(flag(f.name), type={"int": int, "float": float, "str": str}[_kind(f)], **meta)


def build_parser(sections: Sections, description: str = "") -> argparse.ArgumentParser:
    """The flags: the shared ones, then one group per task. A task's flags default to "not given"
    (argparse.SUPPRESS), so that parse_config can tell a flag of another task from its default."""
    parser = _OneLineErrorParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    tasks = list(sections)
    each = [f"{name} ({s.summary})" for name, s in sections.items()]
    what = (", ".join(each[:-1]) + " or " if len(each) > 1 else "") + each[-1]
    defaults = ", ".join(f"{name} {s.default_max_seq_len}" for name, s in sections.items())
    for f in _shared_fields():
        if f.name == "task":
            _add(parser, f, choices=tuple(tasks), help=f"what to train: {what}")
        elif f.name == "max_seq_len":
            _add(parser, f, help=f"{f.metadata['help']} ({defaults})")
        else:
            _add(parser, f)
    added: set[str] = set()
    # A flag two tasks share takes either's values here; TrainConfig.validate checks the task's own.
    choices: dict[str, tuple[Any, ...]] = {}
    for section in sections.values():
        for f in dataclasses.fields(section):
            if f.metadata["choices"]:
                choices[f.name] = tuple(dict.fromkeys(choices.get(f.name, ()) + tuple(f.metadata["choices"])))
    for task, section in sections.items():
        group = parser.add_argument_group(f"--task {task} ({section.summary})")
        for f in dataclasses.fields(section):
            if f.name not in added:  # a flag two tasks share is listed once, with the first one's help
                added.add(f.name)
                _add(group, f, default=argparse.SUPPRESS, help=f"{f.metadata['help']} (default: {f.default})",
                     choices=choices.get(f.name))
    return parser


def parse_config(argv: list[str] | None, sections: Sections, description: str = "") -> TrainConfig:
    """The validated TrainConfig of a command line (and its --config file), with --task's section nested."""
    parser = build_parser(sections, description)
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="YAML or JSON file of flag values (keys as the flags, e.g. batch_size: 8); flags given "
                        "here override it; a run's config.json reads back")
    owners = _owners(sections)
    args = vars(parser.parse_args(argv))
    if args["config"]:  # the file sets defaults, so the command line still wins
        kinds = {f.name: _kind(f) for f in _shared_fields()}
        kinds.update({f.name: _kind(f) for s in sections.values() for f in dataclasses.fields(s)})
        values = read_config_file(args["config"], kinds)
        # A task option at its default is no setting: config.json files before the sections recorded
        # every task's options, and they still read for either task.
        parser.set_defaults(**{k: v for k, v in values.items()
                               if not (k in owners and all(v == _default(sections[t], k) for t in owners[k]))})
        args = vars(parser.parse_args(argv))
    args.pop("config")
    task = args.pop("task")
    if task not in sections:  # from a config file: argparse checks only the command line's choices
        raise CoreCPUError(f"--task {task!r} is not one of: {', '.join(sections)}")
    own = {f.name for f in dataclasses.fields(sections[task])}
    for name in args:
        if name in owners and name not in own:
            where = " or ".join(f"--task {t}" for t in owners[name])
            raise CoreCPUError(f"{flag(name)} applies to {where}, not to --task {task}; drop it or pass the other "
                               "--task")
    options = sections[task](**{k: args.pop(k) for k in own if k in args})
    run = RunOptions(**{f.name: args.pop(f.name) for f in dataclasses.fields(RunOptions)})
    return TrainConfig(task=task, **args, run=run, task_options=options).validate()


def _default(section: type[TaskOptions], name: str) -> Any:
    return section.__dataclass_fields__[name].default
