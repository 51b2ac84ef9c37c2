"""`corecpu export CHECKPOINT DIR`: a checkpoint's model as a directory transformers (or PEFT) loads.

    corecpu export runs/x/checkpoints/step-00000120 model-120/   # that step
    corecpu export runs/x --step best best-model/                # the --keep-best checkpoint (or latest, or N)

A checkpoint (checkpoints/step-N/state.pt) is what a resume needs: weights, optimizer moments, RNG
streams, in one file only corecpu reads. This rebuilds the run's model in one process, without a
process group, exactly as train.py built it (the task's own model(), from the configuration the
checkpoint recorded), loads the step's weights into it, and writes it the way final/ is written
(corecpu.reporting.reporter.export_final): config.json and model.safetensors (for a LoRA run, the
adapter in PEFT's format), the tokenizer, a short README.md and checkpoint.json (which step, what
it scored). The weights are the checkpoint's, bit for bit.

The run's base model (--model) must still be where the run found it, or be named with --model.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping

import torch

from corecpu.errors import CoreCPUError
from corecpu.reporting.reporter import export_final
from corecpu.tasks.registry import make_task, sections
from corecpu.training.checkpoint_disk import PREFIX, checkpoint_root, list_checkpoints, read_meta
from corecpu.training.checkpoint_state import load_model_state, read_checkpoint
from corecpu.training.modeling import load_tokenizer
from corecpu.training.run_options import RunOptions
from corecpu.training.train_config import TrainConfig

STEPS = ("latest", "best")  # --step words; anything else is a step number


def find_checkpoint(spec: str | Path, step: str | None = None) -> Path:
    """The checkpoint directory `spec` names: a step-* directory itself, or a run's output directory with
    `step` "latest" (the default: the newest complete checkpoint), "best" (--keep-best's) or a step number."""
    path = Path(spec)
    if (path / "meta.json").is_file() or path.name.startswith(PREFIX):
        if step is not None:
            raise CoreCPUError(f"--step {step} picks a checkpoint of a run directory, and {path} is one checkpoint; "
                               "drop --step or pass the run's output directory")
        return path
    saved = list_checkpoints(path)
    if not saved:
        raise CoreCPUError(f"no complete checkpoint in {checkpoint_root(path)}; pass a run's --output-dir (one that "
                           "saved checkpoints) or a checkpoints/step-* directory")
    step = step or "latest"
    if step == "latest":
        return saved[-1]
    if step == "best":
        best = ((read_meta(saved[-1])[0] or {}).get("extra") or {}).get("best")
        if not best:
            raise CoreCPUError(f"{path} records no best checkpoint (it was trained without --keep-best METRIC); "
                               "pass --step latest or a step number")
        return checkpoint_root(path) / best["checkpoint"]
    if not step.isdigit():
        raise CoreCPUError(f"--step {step!r} is not a step number, latest or best")
    wanted = checkpoint_root(path) / f"{PREFIX}{int(step):08d}"
    if wanted not in saved:
        have = ", ".join(str(int(p.name[len(PREFIX):])) for p in saved)
        raise CoreCPUError(f"{path} has no checkpoint of step {int(step)}; it has steps {have}")
    return wanted


def config_from_saved(saved: Mapping[str, Any], model: str | None = None) -> TrainConfig:
    """The run's TrainConfig from the flat settings a checkpoint recorded (cfg.to_dict() and the task's
    checkpoint_config()); keys of other versions are ignored, missing ones take their defaults."""
    task = saved.get("task", "classification")
    options = sections().get(task)
    if options is None:
        raise CoreCPUError(f"the checkpoint was trained with --task {task}, which this corecpu does not know; "
                           "register the task (corecpu.tasks.registry.register) before exporting")

    def pick(cls: type) -> dict[str, Any]:
        return {f.name: saved[f.name] for f in dataclasses.fields(cls) if f.name in saved}

    shared = {k: v for k, v in pick(TrainConfig).items() if k not in ("task", "run", "task_options")}
    if model:
        shared["model"] = model
    return TrainConfig(task=task, **shared, run=RunOptions(**pick(RunOptions)), task_options=options(**pick(options)))


def rebuild_model(cfg: TrainConfig, saved: Mapping[str, Any]) -> torch.nn.Module:
    """The untrained model of the run, built by its task as train.py built it. A task's model() sees the data
    only as its checkpoint_config() recorded it (classification: the label names behind its head)."""
    recorded = SimpleNamespace(label_names=saved.get("label_names"), kind=saved.get("data_kind"), source=cfg.data)
    data = SimpleNamespace(train=recorded, eval=None, notes=[], baseline=None)
    try:
        model, _ = make_task(cfg).model(data)  # type: ignore[arg-type]  (what model() reads of TaskData)
    except AttributeError as exc:
        raise CoreCPUError(f"--task {cfg.task} builds its model from more of its data than its checkpoint records "
                           f"({exc}); export its final/ instead, or have checkpoint_config() record it") from None
    return model


def export_checkpoint(checkpoint: str | Path, dest: str | Path, *, step: str | None = None,
                      model: str | None = None) -> tuple[Path, dict[str, Any]]:
    """Write checkpoint `checkpoint` (see find_checkpoint) to `dest` as final/ is written; (the checkpoint
    used, its meta.json). Refuses a `dest` that holds files."""
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise CoreCPUError(f"{dest} already exists and is not empty; remove it or choose another directory")
    path = find_checkpoint(checkpoint, step)
    meta, state = read_checkpoint(path)
    saved = meta.get("config") or {}
    cfg = config_from_saved(saved, model)
    built = rebuild_model(cfg, saved)
    try:
        load_model_state(built, state["model"], meta.get("frozen"), path)  # a LoRA checkpoint omits the base
    except (RuntimeError, KeyError) as exc:
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CoreCPUError(f"checkpoint {path} does not fit the model rebuilt from --model {cfg.model} ({text}); "
                           "pass --model with the base model the run trained") from None
    export_final(dest, built, load_tokenizer(cfg.model), {},
                 card=lambda staging, _: _describe(staging, built, path, meta))
    return path, meta


def _describe(directory: Path, model: torch.nn.Module, checkpoint: Path, meta: Mapping[str, Any]) -> None:
    """checkpoint.json (for tools) and README.md (for people): which step this is and how to load it."""
    extra = meta.get("extra") or {}
    scores = {k: v for k, v in (extra.get("eval") or {}).items() if k != "eval_examples"}
    config = meta.get("config") or {}
    record = {"checkpoint": str(checkpoint.resolve()), "step": meta.get("step"), "epoch": meta.get("epoch"),
              "eval": extra.get("eval"), "best": extra.get("best"), "task": config.get("task"),
              "model": config.get("model"), "world_size": meta.get("world_size")}
    (directory / "checkpoint.json").write_text(json.dumps(record, indent=2) + "\n")
    if hasattr(model, "peft_config"):  # a LoRA run: the adapter, loaded on its base
        load = ("from peft import PeftModel\nfrom transformers import AutoModelForCausalLM\n\n"
                f"base = AutoModelForCausalLM.from_pretrained(\"{config.get('model')}\")  # the base model directory\n"
                "model = PeftModel.from_pretrained(base, \"PATH/TO/THIS\")")
    else:
        cls = type(model).__name__
        load = f"from transformers import {cls}\n\nmodel = {cls}.from_pretrained(\"PATH/TO/THIS\")"
    rows = "\n".join(f"| {k} | {v:.4f} |" for k, v in scores.items() if isinstance(v, (int, float)))
    evaluated = (f"Evaluation at this step:\n\n| metric | value |\n|---|---|\n{rows}\n" if rows
                 else "No evaluation at this step.\n")
    (directory / "README.md").write_text(
        f"# Step {meta.get('step')} of a corecpu run\n\nExported by `corecpu export` from `{checkpoint}` (step "
        f"{meta.get('step')}, --task {config.get('task')}, --model {config.get('model')}).\n\n{evaluated}\n"
        f"## How to load\n\n```python\n{load}\n```\n", encoding="utf-8")
