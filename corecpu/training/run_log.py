"""Where `run.log()` records go: the writers attached with `run.on_log()`, called in order.

The run knows nothing of files or trackers (corecpu.reporting sits above it): train.py's Reporter attaches
itself, and a loop of your own attaches metrics.jsonl and the trackers with `corecpu.log_to(run, DIR)`.
Every rank attaches the same way; only rank 0's writers write.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import torch

from corecpu.errors import CoreCPUError

Writer = Callable[[Mapping[str, Any], int], None]


class RunLog:
    def __init__(self) -> None:
        self._writers: list[Writer] = []

    def attach(self, write: Writer) -> None:
        self._writers.append(write)

    def write(self, values: Mapping[str, Any], step: int) -> None:
        if not self._writers:
            raise CoreCPUError("run.log() has nowhere to write; open metrics.jsonl and the trackers first with "
                               "corecpu.log_to(run, 'runs/NAME', report_to='none')")
        record = {key: plain(key, value) for key, value in values.items()}
        for write in self._writers:
            write(record, step)


def plain(key: str, value: Any) -> Any:
    """A value as JSON holds it: a one-element tensor as its number (a host sync: call run.log() when logging)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise CoreCPUError(f"run.log() value {key!r} is a tensor of {value.numel()} elements; log one number")
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return value  # metrics.jsonl keeps it; the trackers skip it
    if not isinstance(value, (int, float, str, bool, type(None))):
        raise CoreCPUError(f"run.log() value {key!r} is a {type(value).__name__}; log numbers (or short text)")
    return value
