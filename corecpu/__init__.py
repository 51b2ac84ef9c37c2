"""corecpu: data-parallel training on CPU clusters, with a loop you own.

    import corecpu

    with corecpu.setup() as run:                    # launcher, threads, CPUs, process group: once
        loader = run.loader(dataset, batch_size=16)
        model, opt = run.wrap(model, opt, loader=loader, checkpoint=corecpu.Checkpoints("runs/mine"))
        for step in run.steps(loader, epochs=3):
            ...

train.py (beside this package) is built on the same door. The package, by job:

    cluster/      which launcher started us (torch-free)
    cpu/          topology, cgroups, the per-node plan, threads (torch-free)
    distributed/  process group, gradient all-reduce paths
    compute/      precision, IPEX, model wrappers
    reliability/  stop signals, watchdog, lifeline
    data/         examples, files, datasets, built-in tasks, samplers, token cache
    training/     the front door (run), steps, checkpoints, outputs, models, config
    reporting/    reporter, metrics.jsonl, trackers, `corecpu report`, model card
    tasks/        what varies between jobs: classification
    launching/    `corecpu launch`, the bind wrapper (torch-free)
    cli.py        the `corecpu` command, imported by nothing

Imports only go down that list (tests/unit/test_imports.py). The names below load lazily,
so `import corecpu` stays cheap and torch-free until one is used; that first import also
records which CPUs the launcher gave this process, before anything (OpenMP in torch) can
narrow them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import sys

from corecpu import address_space as _address_space
from corecpu.cpu import threads as _threads  # noqa: F401  (records the launcher's CPUs; see cpu/threads.py)
from corecpu.errors import CoreCPUError, die, run_cli

# A script that imported torch first (train.py does) meets corecpu here: a `ulimit -v` too small for torch is
# said now, in one line, instead of as whichever library fails first (see address_space.py).
if "torch" in sys.modules and (_too_small := _address_space.too_small()):
    die(_too_small)

__version__ = "0.1.0"

_LAZY = {
    "setup": ("corecpu.training.connector", "setup"),
    "Run": ("corecpu.training.run", "Run"),
    "RunOptions": ("corecpu.training.run_options", "RunOptions"),
    "Checkpoints": ("corecpu.training.checkpointer", "Checkpoints"),
    "log_to": ("corecpu.reporting.metrics_log", "log_to"),
    "unwrap": ("corecpu.compute.wrappers", "unwrap"),
    "TrainConfig": ("corecpu.training.train_config", "TrainConfig"),
    "save_checkpoint": ("corecpu.training.checkpoint_state", "save"),
    "resume_checkpoint": ("corecpu.training.checkpoint_state", "resume"),
}
__all__ = ["CoreCPUError", "run_cli", *_LAZY]

if TYPE_CHECKING:
    from corecpu.compute.wrappers import unwrap  # noqa: F401
    from corecpu.training.checkpoint_state import resume as resume_checkpoint, save as save_checkpoint  # noqa: F401
    from corecpu.reporting.metrics_log import log_to  # noqa: F401
    from corecpu.training.checkpointer import Checkpoints  # noqa: F401
    from corecpu.training.train_config import TrainConfig  # noqa: F401
    from corecpu.training.run_options import RunOptions  # noqa: F401
    from corecpu.training.connector import setup  # noqa: F401
    from corecpu.training.run import Run  # noqa: F401


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'corecpu' has no attribute {name!r}")
    module, attr = _LAZY[name]
    if too_small := _address_space.too_small():  # these names import torch: the edge where corecpu meets it
        raise CoreCPUError(too_small)
    try:
        loaded = importlib.import_module(module)
    except (MemoryError, ImportError, OSError) as exc:
        if (line := _address_space.memory_failure(exc)) is None:
            raise
        raise CoreCPUError(line) from None
    value = getattr(loaded, attr)
    globals()[name] = value
    return value
