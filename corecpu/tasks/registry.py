"""The tasks train.py can run, by --task name: one module each; a new task is a new module and a line here."""

from __future__ import annotations

from typing import Any

from corecpu.tasks.classification import Classification
from corecpu.tasks.qa import QuestionAnswering
from corecpu.training.config import TASK_NAMES, TrainConfig

TASKS: dict[str, Any] = {"classification": Classification, "qa": QuestionAnswering}
assert tuple(TASKS) == TASK_NAMES, "corecpu.training.config.TASK_NAMES lists the --task choices; keep them in step"


def make_task(cfg: TrainConfig) -> Classification | QuestionAnswering:
    """The task object for cfg.task: data loading, features, model class, evaluation and model card."""
    return TASKS[cfg.task](cfg)
