"""Which columns hold the text, the text pair and the label: shared by files and Hugging Face datasets."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from corecpu.errors import CoreCPUError

# Header conventions (GLUE, HF datasets) tried in order when no columns are given.
DEFAULT_COLUMNS = (("sentence1", "sentence2", "label"), ("text", None, "label"), ("sentence", None, "label"))
COLUMN_FLAGS = "--text-column, --text-pair-column and --label-column (names or 0-based indices)"
Column = str | int | None


def short(values: Sequence[Any], limit: int = 20) -> str:
    shown = ", ".join(repr(str(v)) for v in values[:limit])
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")


def infer_columns(keys: list[str], text: Column, pair: Column, label: Column, path: Path) -> tuple[Column, Column, Column]:
    if text is None:
        for t, p, lab in DEFAULT_COLUMNS:
            if t in keys and (p is None or p in keys) and (label is not None or lab in keys):
                return t, (pair if pair is not None else p), (label if label is not None else lab)
        raise CoreCPUError(f"data file '{path}': cannot tell which columns hold the text and label "
                           f"(available columns: {short(keys)}); pick them with {COLUMN_FLAGS}")
    if label is None and "label" not in keys:
        raise CoreCPUError(f"data file '{path}': no 'label' column (available columns: {short(keys)}); "
                           "pick it with --label-column NAME_OR_INDEX")
    return text, pair, "label" if label is None else label
