"""Tier 1: the task contract (corecpu.tasks.contract) and the one registry the --task choices come from."""

from __future__ import annotations

import pytest

from corecpu.errors import CoreCPUError
from corecpu.tasks import registry
from corecpu.tasks.causal_lm import CausalLM
from corecpu.tasks.classification import Classification
from corecpu.tasks.contract import MEMBERS, Task, missing_members
from corecpu.tasks.qa import QuestionAnswering
from corecpu.tasks.registry import build_parser, make_task, parse_config, register
from helpers.toy_task import Regression


def test_the_contract_names_what_train_py_calls():
    assert set(MEMBERS) == {"name", "Options", "loss_items", "load", "model", "features", "collate",
                            "checkpoint_config", "describe", "evaluate", "eval_line", "model_card"}
    for method in set(MEMBERS) - {"name", "Options", "loss_items"}:
        assert getattr(Task, method).__doc__, f"Task.{method} says what it receives, returns and where it runs"


@pytest.mark.parametrize("argv, cls", [([], Classification), (["--task", "qa"], QuestionAnswering),
                                       (["--task", "causal-lm"], CausalLM)])
def test_every_task_keeps_the_contract(argv, cls):
    task = make_task(parse_config(argv))
    assert type(task) is cls and isinstance(task, Task) and missing_members(cls) == []


def test_a_class_missing_a_method_breaks_it():
    class Partial:
        name, Options = "partial", Classification.Options

        def load(self): ...

    assert not isinstance(Partial(), Task)
    assert "eval_line" in missing_members(Partial) and "load" not in missing_members(Partial)
    with pytest.raises(CoreCPUError, match="^task Partial lacks checkpoint_config, collate, describe, eval_line, "):
        register(Partial)


def test_the_task_choices_are_the_registry(monkeypatch):
    (choices,) = [a.choices for a in build_parser()._actions if a.dest == "task"]
    assert tuple(choices) == tuple(registry.TASKS) == ("classification", "qa", "causal-lm")
    monkeypatch.setattr(registry, "TASKS", dict(registry.TASKS))
    register(Regression)  # the one line a new task needs
    (choices,) = [a.choices for a in build_parser()._actions if a.dest == "task"]
    assert tuple(choices) == ("classification", "qa", "causal-lm", "regression")
    cfg = parse_config(["--task", "regression", "--scale", "2"])
    assert isinstance(make_task(cfg), Regression) and cfg.task_options.scale == 2.0 and cfg.data == "builtin"
    with pytest.raises(CoreCPUError, match="^--doc-stride applies to --task qa, not to --task regression; drop it"):
        parse_config(["--task", "regression", "--doc-stride", "64"])
    with pytest.raises(CoreCPUError, match="^--scale applies to --task regression, not to --task classification"):
        parse_config(["--scale", "2"])
    with pytest.raises(CoreCPUError, match="--task qa is taken by QuestionAnswering"):
        register(type("OtherQA", (Regression,), {"name": "qa"}))


def test_make_task_wants_the_tasks_own_section():
    cfg = parse_config([])
    cfg.task = "qa"
    with pytest.raises(CoreCPUError, match=r"--task qa needs its options as cfg.task_options \(QAOptions\), got "
                                           "ClassificationOptions"):
        make_task(cfg)
