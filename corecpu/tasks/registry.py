"""The tasks train.py can run, by --task name: the one list the --task choices come from.

A new task is one module (a class keeping corecpu.tasks.contract.Task, with its own TaskOptions
section) plus one line below; code outside the package (a test, a script) calls `register()`.
The command line is built here, one layer above corecpu.training.train_config, so that the config
module can stay below the tasks: this registry passes each task's options section down to it.
"""

from __future__ import annotations

import argparse

from corecpu.errors import CoreCPUError
from corecpu.tasks.causal_lm import CausalLM
from corecpu.tasks.classification import Classification
from corecpu.tasks.contract import Task, missing_members
from corecpu.tasks.qa import QuestionAnswering
from corecpu.training import train_config as config
from corecpu.training.train_config import Sections, TaskOptions, TrainConfig

TASKS: dict[str, type[Task]] = {}  # --task name -> task class, in --help order


def register(task_class: type[Task]) -> type[Task]:
    """Add a task under `task_class.name` (usable as a class decorator); refuses one that breaks the contract."""
    missing = missing_members(task_class)
    if missing:
        raise CoreCPUError(f"task {task_class.__name__} lacks {', '.join(missing)}; "
                           "corecpu.tasks.contract.Task lists what a task provides")
    if not (isinstance(task_class.Options, type) and issubclass(task_class.Options, TaskOptions)):
        raise CoreCPUError(f"task {task_class.__name__}: Options must be a TaskOptions dataclass "
                           f"(corecpu.training.train_config), got {task_class.Options!r}")
    if TASKS.get(task_class.name, task_class) is not task_class:
        raise CoreCPUError(f"--task {task_class.name} is taken by {TASKS[task_class.name].__name__}; "
                           f"give {task_class.__name__} another name")
    TASKS[task_class.name] = task_class
    return task_class


register(Classification)
register(QuestionAnswering)
register(CausalLM)


def sections() -> Sections:
    """{--task name: its options class}: what the command line needs of each task."""
    return {name: task.Options for name, task in TASKS.items()}


def build_parser(description: str = "") -> argparse.ArgumentParser:
    return config.build_parser(sections(), description)


def parse_config(argv: list[str] | None = None, description: str = "") -> TrainConfig:
    """train.py's configuration from its command line (and --config file), for the registered tasks."""
    return config.parse_config(argv, sections(), description)


def make_task(cfg: TrainConfig) -> Task:
    """The task object for cfg.task: data loading, features, model class, evaluation and model card."""
    task_class = TASKS.get(cfg.task)
    if task_class is None:
        raise CoreCPUError(f"--task {cfg.task!r} is not one of: {', '.join(TASKS)}")
    if not isinstance(cfg.task_options, task_class.Options):
        raise CoreCPUError(f"--task {cfg.task} needs its options as cfg.task_options ({task_class.Options.__name__}), "
                           f"got {type(cfg.task_options).__name__}; build the configuration with parse_config")
    return task_class(cfg)  # type: ignore[call-arg]  (the contract's constructor: Task(cfg))
