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


# What spreadsheets and dataframes write for an empty cell: a missing label, never a class of its own.
MISSING = frozenset({"nan", "none", "null", "n/a", "<na>"})
RARE_FEWER_THAN, RARE_SHARE = 5, 0.01  # a class below both is worth a second look


def check_labels(labels: Sequence[tuple[str, str]], source: str) -> list[str]:
    """One rule for every source: (where, label) pairs, e.g. ("line 7", "pos"), already stripped.

    A missing-value spelling or two spellings that differ only in case are errors (one line naming
    both places); a class with very few examples gives a note (returned) for the run to print."""
    first: dict[str, tuple[str, str]] = {}
    counts: dict[str, int] = {}
    for where, label in labels:
        if label.lower() in MISSING:
            raise CoreCPUError(f"data '{source}' {where}: label {label!r} is a missing value, not a class; "
                               "fix or remove the row")
        seen = first.setdefault(label.lower(), (where, label))
        if seen[1] != label:
            raise CoreCPUError(f"data '{source}' {seen[0]} and {where}: labels {seen[1]!r} and {label!r} differ only "
                               "in case; spell each label one way")
        counts[label] = counts.get(label, 0) + 1
    total = len(labels)
    return [f"data '{source}': label {name!r} has only {n} of {total} examples; check the label column"
            for name, n in sorted(counts.items()) if n < RARE_FEWER_THAN and n < RARE_SHARE * total]
