"""Hugging Face `datasets` sources for --data: a Parquet or Arrow file, or a save_to_disk directory.

Read offline, from local files only, with the same column flags, default column names
and one-line errors as TSV/CSV/JSONL files (corecpu.data.load_file). A ClassLabel label
column gives the label names in its own order, so label ids match the dataset's.

    is_hf_source(spec)          -> does --data name something this module reads?
    load_hf_dataset(spec, split="train"|"eval", text_column=..., label_names=...) -> ClassificationData
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

from corecpu import envvars
from corecpu.data.columns import COLUMN_FLAGS, Column, check_labels, infer_columns, short
from corecpu.data.types import ClassificationData
from corecpu.errors import CoreCPUError, install_extra

HF_SUFFIXES = (".parquet", ".arrow")
SAVED_MARKERS = ("dataset_dict.json", "state.json", "dataset_info.json")  # what save_to_disk writes
# DatasetDict split names tried for each corecpu split, in order.
SPLITS = {"train": ("train",), "eval": ("validation", "test", "eval", "dev", "valid")}


def is_hf_source(spec: str | Path) -> bool:
    path = Path(spec)
    if path.suffix.lower() in HF_SUFFIXES:
        return True
    return path.is_dir() and any((path / m).is_file() for m in SAVED_MARKERS)


@contextlib.contextmanager
def _offline() -> Iterator[Any]:
    """datasets with hub access switched off; it reads these variables from the process environment when
    first imported, so they are set there for this block only."""
    with envvars.scoped(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"):
        try:
            import datasets
        except ImportError:
            raise CoreCPUError("reading a Parquet/Arrow file or a save_to_disk directory needs the datasets package; "
                               f"{install_extra('datasets')}") from None
        datasets.disable_progress_bars()
        yield datasets


def open_dataset(path: Path, split: str) -> Any:
    """The datasets.Dataset for `split` of the source at `path` (memory-mapped, no cache copy)."""
    with _offline() as datasets:
        try:
            if path.suffix.lower() == ".parquet":
                import pyarrow.parquet as pq

                # Dataset(table) keeps the features stored in the file (ClassLabel names included)
                # without load_dataset's copy into ~/.cache.
                return datasets.Dataset(pq.read_table(path, memory_map=True))
            if path.suffix.lower() == ".arrow":
                return datasets.Dataset.from_file(str(path))
            loaded = datasets.load_from_disk(str(path))
        except CoreCPUError:
            raise
        except Exception as exc:  # noqa: BLE001 - pyarrow/datasets raise many kinds for a bad file
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CoreCPUError(f"data '{path}' cannot be read as a Hugging Face dataset ({first}); pass a Parquet or "
                               "Arrow file or a directory written by save_to_disk") from None
    if isinstance(loaded, datasets.DatasetDict):
        for name in SPLITS.get(split, (split,)):
            if name in loaded:
                return loaded[name]
        wanted = " or ".join(repr(s) for s in SPLITS.get(split, (split,)))
        raise CoreCPUError(f"data '{path}' has splits {short(list(loaded))}, none named {wanted}; save the "
                           f"{split} split under one of those names or pass that split's directory")
    return loaded


def load_hf_dataset(spec: str | Path, *, split: str = "train", text_column: Column = None,
                    text_pair_column: Column = None, label_column: Column = None,
                    label_names: Sequence[str] | None = None, fmt: str | None = None,
                    has_header: bool = True) -> ClassificationData:
    """Load one split of a Hugging Face dataset as classification data.

    Pass the training set's `label_names` when loading eval data so ids agree.
    """
    path = Path(spec)
    if fmt not in (None, "auto"):
        raise CoreCPUError(f"--data-format {fmt} does not apply to the Hugging Face dataset '{path}'; drop it")
    if not path.exists():
        raise CoreCPUError(f"data '{path}' not found; pass --data with a Parquet/Arrow file or a save_to_disk directory")
    ds = open_dataset(path, split)
    keys = list(ds.column_names)
    if not len(ds):
        raise CoreCPUError(f"data '{path}' ({split}) has no examples; pass a dataset with at least one row")
    text, pair, label = infer_columns(keys, text_column, text_pair_column, label_column, path)
    text, pair, label = (None if c is None else _column(c, keys, what, path)
                         for c, what in ((text, "text"), (pair, "text pair"), (label, "label")))
    # ds[name] is a lazy Column in datasets 4+; the tokenizer and the cache want plain lists.
    texts = _strings(list(ds[text]), path, "text")
    pairs = _strings(list(ds[pair]), path, "text pair") if pair is not None else None
    feature = ds.features[label]
    classes = list(feature.names) if hasattr(feature, "names") else None  # a ClassLabel
    raw = [_label(v, i, classes, path) for i, v in enumerate(ds[label])]
    notes = check_labels([(f"row {i}", lab) for i, lab in enumerate(raw)], str(path))
    if label_names is not None:
        names = list(label_names)
    elif classes is not None:
        names = classes
    else:
        names = sorted(set(raw))
        if all(n.lstrip("-").isdigit() for n in names):  # numeric order, as for files
            names.sort(key=int)
        if len(names) < 2:
            raise CoreCPUError(f"data '{path}': every example has label {names[0]!r}; classification needs at least "
                               "2 labels (check --label-column)")
    index = {n: i for i, n in enumerate(names)}
    for row, lab in enumerate(raw):
        if lab not in index:
            raise CoreCPUError(f"data '{path}' row {row}: label {lab!r} is not in the training data's labels "
                               f"({short(names)}); use eval data with the same label set")
    return ClassificationData(texts, pairs, [index[lab] for lab in raw], names, f"{path}:{split}", notes)


def _column(col: Column, keys: list[str], what: str, path: Path) -> str:
    flag = "--" + what.replace(" ", "-") + "-column"
    if col in keys:
        return col  # type: ignore[return-value]
    if isinstance(col, int) or str(col).isdigit():
        if int(col) < len(keys):
            return keys[int(col)]
        raise CoreCPUError(f"data '{path}': {what} column index {col} is out of range (the dataset has {len(keys)} "
                           f"columns: {short(keys)}); pass {flag} with a valid name or index")
    raise CoreCPUError(f"data '{path}': no {what} column named {col!r} (available columns: {short(keys)}); "
                       f"pass {flag} NAME_OR_INDEX")


def _strings(values: list[Any], path: Path, what: str) -> list[str]:
    for row, v in enumerate(values):
        if not isinstance(v, str):
            raise CoreCPUError(f"data '{path}' row {row}: {what} must be a string, found {type(v).__name__}; "
                               f"pick a text column with {COLUMN_FLAGS}")
        if not v.strip():
            raise CoreCPUError(f"data '{path}' row {row}: empty {what}; fix or drop the row")
    return values


def _label(value: Any, row: int, classes: list[str] | None, path: Path) -> str:
    if classes is not None and isinstance(value, int) and not isinstance(value, bool):
        if 0 <= value < len(classes):
            return classes[value]
        raise CoreCPUError(f"data '{path}' row {row}: label id {value} is not a class of the ClassLabel column "
                           f"({len(classes)} classes; -1 means unlabelled); drop unlabelled rows")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise CoreCPUError(f"data '{path}' row {row}: label must be a string or integer, found {value!r}; "
                           "corecpu does classification, not regression")
    if not str(value).strip():
        raise CoreCPUError(f"data '{path}' row {row}: empty label; fix or drop the row")
    return str(value).strip()
