"""corecpu: data-parallel training on CPU clusters, with a loop you own.

    import corecpu

    with corecpu.setup() as run:                    # launcher, threads, CPUs, process group: once
        model, optimizer = run.wrap(model, optimizer)
        for batch in run.loader(dataset, batch_size=16):
            ...

train.py (beside this package) is built on the same door. The names below load
lazily, so `import corecpu` stays cheap and torch-free until one is used; that
first import also records which CPUs the launcher gave this process, before
anything (OpenMP in torch) can narrow them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from corecpu import threads as _threads  # noqa: F401  (records the launcher's CPUs; see threads.py)
from corecpu.errors import CoreCPUError

__version__ = "0.1.0"

_LAZY = {
    "setup": ("corecpu.run", "setup"),
    "Run": ("corecpu.run", "Run"),
    "unwrap": ("corecpu.run", "unwrap"),
    "TrainConfig": ("corecpu.config", "TrainConfig"),
    "save_checkpoint": ("corecpu.checkpoint", "save"),
    "resume_checkpoint": ("corecpu.checkpoint", "resume"),
}
__all__ = ["CoreCPUError", *_LAZY]

if TYPE_CHECKING:
    from corecpu.checkpoint import resume as resume_checkpoint, save as save_checkpoint  # noqa: F401
    from corecpu.config import TrainConfig  # noqa: F401
    from corecpu.run import Run, setup, unwrap  # noqa: F401


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'corecpu' has no attribute {name!r}")
    import importlib

    module, attr = _LAZY[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value
