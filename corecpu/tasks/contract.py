"""The task contract: exactly what train.py (and the command line) use of a task, and nothing more.

A task is a class, built once per rank as `Task(cfg)` by corecpu.tasks.registry.make_task, where
`cfg` is the validated TrainConfig with this task's own options nested as `cfg.task_options` (an
instance of the class's `Options`). train.py calls its methods in this order, on every rank
unless a method says otherwise:

    load -> model -> features -> collate -> checkpoint_config -> describe
    -> (evaluate -> eval_line) at the end of each epoch (or every --eval-steps steps) and the last step -> model_card

The loop itself is the same for every task: a batch from `collate` goes to `model(**batch)`
after train.py pops the META_KEYS (num_tokens, num_padded, num_attended, valid; corecpu.data.tokenized), and
the model's output must have `.loss` (see `loss_items` for what it is a mean over). `registry.register` refuses a class that lacks a member
below, naming it; `isinstance(task, Task)` checks an instance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

import torch
from torch.utils.data import DataLoader

from corecpu.training.train_config import TaskOptions
from corecpu.training.run import Run


class TaskData(Protocol):
    """What `Task.load` returns: anything the task's other methods read back, plus `notes`."""

    notes: list[str]  # one line each, printed as warnings at start-up (rank 0)


class Features(Protocol):
    """What `Task.features` returns: a map-style Dataset of dicts that `collate` batches."""

    lengths: list[int]  # tokens per item: length grouping (train) and longest-first evaluation (eval)

    def __len__(self) -> int: ...
    def __getitem__(self, key: Any) -> dict[str, Any]: ...


@runtime_checkable
class Task(Protocol):
    """One job train.py can run: how data becomes features, the model class, what evaluation computes."""

    name: str  # the --task value it is registered under
    Options: type[TaskOptions]  # its own options, nested as cfg.task_options (corecpu.training.train_config)
    # None: the model's loss is a mean per example, and every micro-batch of a step counts alike. Else how
    # many items (label tokens) a batch's loss is the mean over: the step then weighs batches by it
    # (step.micro_batches(count=...)), so the step's gradient is the mean over all its items on all ranks.
    loss_items: Callable[[Mapping[str, Any]], float] | None

    def load(self) -> TaskData:
        """Read the training data and, unless --eval-data is none, the held-out data.

        Every rank, inside `run.agreeing()`: raise CoreCPUError for bad input (one rank's error then
        stops every rank with its message); no collectives here, and no tokenizing yet."""

    def model(self, data: TaskData) -> tuple[torch.nn.Module, str]:
        """The untrained model for this data (e.g. a head sized to its labels), and a one-line description.

        Every rank, inside `run.agreeing()`; seed before building it (cfg.seed) so that every rank
        builds the same weights. Its forward takes a collated batch and returns an output with `.loss`."""

    def features(self, data: TaskData, tokenizer: Any, run: Run) -> tuple[Features, Features | None]:
        """The training features and the eval features (None without eval data).

        Every rank, after the model. May coordinate per host through files (local rank 0 tokenizes,
        the others read its cache: run.local_rank), never through collectives. Eval items must accept
        an `(index, valid)` key: the eval sampler marks the filler items that even out the shards."""

    def collate(self, tokenizer: Any) -> Callable[[list[dict[str, Any]]], dict[str, Any]]:
        """The DataLoader's collate_fn for both loaders: model inputs (and labels) as tensors, plus
        corecpu.data.tokenized.META_KEYS (make_collate adds them; of a collate of your own, num_tokens is
        required, and without num_attended MFU takes every row's attention as long as their mean).
        Pure; every rank."""

    def checkpoint_config(self, data: TaskData) -> dict[str, Any]:
        """Settings learned from the data (not in cfg.to_dict()) that a checkpoint must match to resume,
        e.g. the label names behind a classification head; {} if none. Pure, the same on every rank."""

    def describe(self, data: TaskData) -> str:
        """One line about the data for the start-up log (rank 0 prints it). Pure."""

    def evaluate(self, run: Run, model: torch.nn.Module, loader: DataLoader) -> dict[str, float]:
        """Scores over the whole eval set, the same dict on every rank.

        Collective: every rank calls it at the same steps with its shard (run.eval_loader). Run the
        forward passes and the reduction inside `run.evaluating(model)`; weight by batch["valid"] so
        that fillers count nothing; reduce with run.all_reduce_sum / run.gather. Keys start with
        "eval_" and include "eval_examples". Rank 0 alone may write files (run.is_main)."""

    def eval_line(self, step: int, scores: Mapping[str, float]) -> str:
        """One line for people about `scores` at optimizer step `step` (rank 0 prints it). Pure."""

    def model_card(self, final: Path, config: Mapping[str, Any], summary: Mapping[str, Any],
                   data: TaskData) -> None:
        """Write README.md (and anything else beside the weights) into `final`, the directory that becomes
        final/. Rank 0 only, at the end; `config` is cfg.to_dict(), `summary` what summary.json holds."""


# The members a task class must have, read from the Protocol itself (nothing to keep in step).
MEMBERS: tuple[str, ...] = tuple(sorted({*Task.__annotations__,
                                         *(n for n, v in vars(Task).items() if callable(v) and not n.startswith("_"))}))


def missing_members(task_class: type) -> list[str]:
    """The contract's members that `task_class` lacks; [] when it keeps the contract."""
    return [name for name in MEMBERS if not hasattr(task_class, name)]
