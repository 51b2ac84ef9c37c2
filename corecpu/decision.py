"""An automatic choice and its reason, as config.json's `decisions` and the start-up lines record it.

The simple ones (dropout kernel, the embedding's gradient, its sparse all-reduce, bucket casts) are this and
nothing more; choices that carry measurements (precision, attention) are dataclasses of their own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Decision:
    name: str  # what was chosen, e.g. "on" | "off"
    reason: str  # why, in words a person reads in config.json

    def __str__(self) -> str:
        return f"{self.name} ({self.reason})"


__all__ = ["Decision"]
