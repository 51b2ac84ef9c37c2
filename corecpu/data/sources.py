"""What --data and --eval-data name: a built-in task, a Hugging Face dataset, or a file.

    data = load_data(spec, split="train")                                 # ClassificationData
    held = load_data(auto_eval_data(spec), split="eval", label_names=data.label_names)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from corecpu.data.builtin import TASKS, task_dataset
from corecpu.data.files import load_file
from corecpu.data.hf import SPLITS, is_hf_source, load_hf_dataset
from corecpu.data.types import ClassificationData
from corecpu.errors import CoreCPUError

_OPTION_FLAGS = {"fmt": "--data-format", "has_header": "--no-header"}


def is_task(spec: str) -> bool:
    """True when --data/--eval-data names a built-in task rather than a file."""
    return spec in TASKS


def auto_eval_data(spec: str) -> str:
    """What --eval-data auto means for --data `spec`: a built-in task's held-out split, a saved
    DatasetDict's eval split (validation, test, ...), otherwise no evaluation ("none")."""
    if is_task(spec):
        return spec
    path = Path(spec)
    if path.is_dir() and (path / "dataset_dict.json").is_file():
        return spec if any((path / s).is_dir() for s in SPLITS["eval"]) else "none"
    return "none"


def load_data(spec: str, *, split: str = "train", seed: int = 0, label_names: Sequence[str] | None = None,
              **file_options: Any) -> ClassificationData:
    """`spec` is a built-in task name (corecpu.data.builtin.TASKS), a file path, or a Hugging Face dataset
    (corecpu.data.hf); file_options go to load_file (fmt, *_column, has_header) and must stay unset for a task."""
    if not is_task(spec):
        if is_hf_source(spec):
            return load_hf_dataset(spec, split=split, label_names=label_names, **file_options)
        return load_file(spec, label_names=label_names, **file_options)
    used = [k for k, v in file_options.items() if v not in (None, True)]
    if used:
        flag = _OPTION_FLAGS.get(used[0], "--" + used[0].replace("_", "-"))
        raise CoreCPUError(f"{flag} does not apply to the built-in task --data {spec}; drop it or pass --data PATH")
    data = task_dataset(spec, split, seed=seed)
    if label_names is not None and list(label_names) != data.label_names:
        raise CoreCPUError(f"the built-in task {spec} has labels {data.label_names}, the training data "
                           f"{list(label_names)}; use the same task for --data and --eval-data, or files for both")
    return data
