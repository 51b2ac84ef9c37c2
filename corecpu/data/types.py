"""Labelled examples: the type every data source returns. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ClassificationData:
    texts: list[str]
    text_pairs: list[str] | None
    labels: list[int]
    label_names: list[str]
    source: str
    notes: list[str] = field(default_factory=list, compare=False)  # worth a warning line (rare classes)

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def num_labels(self) -> int:
        return len(self.label_names)
