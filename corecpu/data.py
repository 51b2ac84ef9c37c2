"""Classification data: file loading, tokenization and batch collation.

The built-in tasks live in corecpu/tasks.py, samplers and loaders in corecpu/sampling.py.
Batches from `make_collate` carry non-model keys, listed in META_KEYS, that the
training loop must pop before calling the model:
  num_tokens  int, real (non-pad) tokens in the batch, for tokens/s logging;
  num_padded  int, pad positions in the batch: padding fraction = num_padded / (num_padded + num_tokens);
  valid       BoolTensor (B,), False for filler items that only exist so every rank
              runs the same number of eval batches. Weight per-example metrics by it.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from torch.utils.data import Dataset

from corecpu.errors import CoreCPUError

META_KEYS = ("num_tokens", "num_padded", "valid")
FORMATS = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json-lines": "jsonl"}
# Header conventions (GLUE, HF datasets) tried in order when no columns are given.
DEFAULT_COLUMNS = (("sentence1", "sentence2", "label"), ("text", None, "label"), ("sentence", None, "label"))
COLUMN_FLAGS = "--text-column, --text-pair-column and --label-column (names or 0-based indices)"
Column = str | int | None


@dataclass
class ClassificationData:
    texts: list[str]
    text_pairs: list[str] | None
    labels: list[int]
    label_names: list[str]
    source: str

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def num_labels(self) -> int:
        return len(self.label_names)


# ---------------------------------------------------------------- file loading

def _short(values: Sequence[Any], limit: int = 20) -> str:
    shown = ", ".join(repr(str(v)) for v in values[:limit])
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")


def _read_text(path: Path) -> str:
    """The file decoded as UTF-8 (a BOM is dropped); a bad byte is reported by line and column."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line_start = raw.rfind(b"\n", 0, exc.start) + 1
        lineno = raw.count(b"\n", 0, exc.start) + 1
        raise CoreCPUError(f"data file '{path}' line {lineno}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at byte "
                           f"{exc.start - line_start + 1} of the line: {exc.reason}); convert the file to UTF-8, "
                           f"e.g. iconv -f latin1 -t utf-8") from None


def _records(path: Path, fmt: str) -> Iterator[tuple[int, Any]]:
    """Yield (starting line number, row) for non-blank rows; rows are lists (tsv/csv) or dicts."""
    with io.StringIO(_read_text(path), newline="") as fh:
        if fmt == "jsonl":
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise CoreCPUError(f"data file '{path}' line {lineno}: invalid JSON ({exc.msg}); "
                                       "each line of a JSONL file must be one JSON object") from None
                if not isinstance(obj, dict):
                    raise CoreCPUError(f"data file '{path}' line {lineno}: expected a JSON object, found "
                                       f"{type(obj).__name__}; write one object per line, e.g. "
                                       '{"text": "...", "label": "..."}')
                yield lineno, obj
            return
        # GLUE TSVs (MRPC, SST-2) contain bare quote characters: with quoting on, csv would
        # swallow tabs and newlines until the next quote. CSV keeps normal RFC 4180 quoting.
        reader = csv.reader(fh, **({"delimiter": "\t", "quoting": csv.QUOTE_NONE} if fmt == "tsv" else {}))
        prev = 0
        try:
            for row in reader:
                start, prev = prev + 1, reader.line_num  # a quoted CSV record can span lines
                if any(cell.strip() for cell in row):
                    yield start, row
        except csv.Error as exc:
            raise CoreCPUError(f"data file '{path}' line {reader.line_num}: malformed {fmt.upper()} ({exc}); "
                               "fix the row or pass the right --data-format") from None


def _pick(col: Column, header: list[str] | None, jsonl: bool, what: str, path: Path) -> int | str:
    """Resolve a column given by name or 0-based index to a row index (tsv/csv) or key (jsonl)."""
    flag = "--" + what.replace(" ", "-") + "-column"
    if header is not None and col in header:
        return col if jsonl else header.index(col)  # type: ignore[arg-type]
    if jsonl:
        raise CoreCPUError(f"data file '{path}': no {what} key {col!r} in the first line (keys: {_short(header)}); "
                           f"pass {flag} with one of those keys")
    if isinstance(col, int) or str(col).isdigit():
        if header is not None and int(col) >= len(header):  # type: ignore[arg-type]
            raise CoreCPUError(f"data file '{path}': {what} column index {col} is out of range (the file has "
                               f"{len(header)} columns: {_short(header)}); pass {flag} with a valid name or index")
        return int(col)  # type: ignore[arg-type]
    avail = f"available columns: {_short(header)}" if header else "the file has no header, so use 0-based indices"
    raise CoreCPUError(f"data file '{path}': no {what} column named {col!r} ({avail}); pass {flag} NAME_OR_INDEX")


def _infer(keys: list[str], text: Column, pair: Column, label: Column, path: Path) -> tuple[Column, Column, Column]:
    if text is None:
        for t, p, lab in DEFAULT_COLUMNS:
            if t in keys and (p is None or p in keys) and (label is not None or lab in keys):
                return t, (pair if pair is not None else p), (label if label is not None else lab)
        raise CoreCPUError(f"data file '{path}': cannot tell which columns hold the text and label "
                           f"(available columns: {_short(keys)}); pick them with {COLUMN_FLAGS}")
    if label is None and "label" not in keys:
        raise CoreCPUError(f"data file '{path}': no 'label' column (available columns: {_short(keys)}); "
                           "pick it with --label-column NAME_OR_INDEX")
    return text, pair, "label" if label is None else label


def load_file(path: str | Path, *, fmt: str | None = None, text_column: Column = None,
              text_pair_column: Column = None, label_column: Column = None, has_header: bool = True,
              label_names: Sequence[str] | None = None) -> ClassificationData:
    """Load a TSV/CSV/JSONL classification file.

    Pass the training set's `label_names` when loading an eval file so label ids agree;
    labels the training set never had are then an error instead of a silent new class.
    """
    path = Path(path)
    if not path.is_file():
        raise CoreCPUError(f"data file '{path}' not found; pass --data PATH to a TSV, CSV or JSONL file, "
                           f"or a built-in task: --data {' or '.join(_task_names())}")
    if fmt is None and path.suffix.lower() not in FORMATS:
        raise CoreCPUError(f"data file '{path}': cannot tell the format from extension {path.suffix!r}; "
                           "rename it to .tsv, .csv or .jsonl, or pass --data-format tsv|csv|jsonl")
    fmt = (fmt or FORMATS[path.suffix.lower()]).lower()
    if fmt not in ("tsv", "csv", "jsonl"):
        raise CoreCPUError(f"unknown data format {fmt!r}; pass --data-format tsv, csv or jsonl")
    texts, pairs, raw = _parse(path, fmt, (text_column, text_pair_column, label_column), has_header)
    raw = canonical_labels(raw, path)
    if label_names is None:
        names = sorted({lab for _, lab in raw})
        if all(_NUMBER.fullmatch(n) for n in names):  # numeric order: "10" after "9", label i is id i
            names.sort(key=Decimal)
        if len(names) < 2:
            raise CoreCPUError(f"data file '{path}': every example has label {names[0]!r}; classification needs "
                               "at least 2 labels (check --label-column)")
    else:
        names = list(label_names)
    index = {n: i for i, n in enumerate(names)}
    for lineno, lab in raw:
        if lab not in index:
            raise CoreCPUError(f"data file '{path}' line {lineno}: label {lab!r} is not in the training data's "
                               f"labels ({_short(names)}); use an eval file with the same label set")
    return ClassificationData(texts, pairs, [index[lab] for _, lab in raw], names, str(path))


def _parse(path: Path, fmt: str, columns: tuple[Column, Column, Column],
           has_header: bool) -> tuple[list[str], list[str] | None, list[tuple[int, str]]]:
    jsonl = fmt == "jsonl"
    rows = _records(path, fmt)
    first = next(rows, None)
    if first is None:
        raise CoreCPUError(f"data file '{path}' is empty (no examples); add a header line and one example per line"
                           if not jsonl else f"data file '{path}' has no examples; add one JSON object per line")
    header = None
    if jsonl:  # JSONL keys play the header's part
        header, rows = list(first[1]), itertools.chain([first], rows)
    elif has_header:
        header = [h.strip() for h in first[1]]
    else:
        rows = itertools.chain([first], rows)
    if header is not None:
        columns = _infer(header, *columns, path)
    elif columns[0] is None or columns[2] is None:
        raise CoreCPUError(f"data file '{path}' has no header; pick columns by 0-based index with {COLUMN_FLAGS}")
    cols = [None if c is None else _pick(c, header, jsonl, what, path)
            for c, what in zip(columns, ("text", "text pair", "label"))]
    width = None if jsonl else len(header) if header is not None else None
    texts: list[str] = []
    pairs: list[str] | None = [] if cols[1] is not None else None
    raw: list[tuple[int, str]] = []
    for lineno, row in rows:
        where = f"data file '{path}' line {lineno}"
        if jsonl:
            missing = [c for c in cols if c is not None and c not in row]
            if missing:
                raise CoreCPUError(f"{where}: missing key {missing[0]!r} (keys here: {_short(list(row))}); "
                                   "every line needs the text and label keys")
        else:
            width = width or len(row)  # headerless: the first row fixes the width
            if len(row) != width:
                raise CoreCPUError(f"{where}: expected {width} {'tab' if fmt == 'tsv' else 'comma'}-separated "
                                   f"fields like the {'header' if header else 'first row'}, found {len(row)}; "
                                   "fix or remove the row")
            if max(c for c in cols if c is not None) >= width:  # type: ignore[type-var]
                raise CoreCPUError(f"{where}: a column index is out of range (rows have {width} fields); "
                                   f"pick columns with {COLUMN_FLAGS}")
        text, pair, lab = (None if c is None else row[c] for c in cols)
        for name, v in (("text", text), ("text pair", pair if pairs is not None else "-")):
            if not isinstance(v, str):
                raise CoreCPUError(f"{where}: {name} must be a string, found {type(v).__name__}; fix the row")
            if not v.strip():
                raise CoreCPUError(f"{where}: empty {name}; fix or remove the row")
        if isinstance(lab, float) and lab.is_integer():
            lab = int(lab)  # JSON 1.0 is the class 1
        if isinstance(lab, bool) or not isinstance(lab, (str, int)):
            raise CoreCPUError(f"{where}: label must be a string or integer, found {lab!r}; "
                               "corecpu does classification, not regression")
        if not str(lab).strip():
            raise CoreCPUError(f"{where}: empty label; fix or remove the row")
        texts.append(text)
        if pairs is not None:
            pairs.append(pair)
        raw.append((lineno, str(lab).strip()))
    if not texts:
        raise CoreCPUError(f"data file '{path}' has no examples after the header; add at least one row")
    return texts, pairs, raw


# A number as people write labels: 1, 01, -1, 1.0, 1e0 (not nan/inf, which are names here).
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _canonical_number(text: str) -> str:
    value = Decimal(text).normalize()
    return format(value if value != 0 else Decimal(0), "f")  # "1.0" -> "1", "01" -> "1", "-0" -> "0"


def canonical_labels(raw: list[tuple[int, str]], path: str | Path) -> list[tuple[int, str]]:
    """Numeric labels by value: when every label is a number, 1, 1.0 and 01 become the class "1".
    When some are not numbers, labels stay strings, but two spellings of one number are an error."""
    if all(_NUMBER.fullmatch(lab) for _, lab in raw):
        return [(lineno, _canonical_number(lab)) for lineno, lab in raw]
    first: dict[str, tuple[int, str]] = {}
    for lineno, lab in raw:
        if _NUMBER.fullmatch(lab):
            seen = first.setdefault(_canonical_number(lab), (lineno, lab))
            if seen[1] != lab:
                raise CoreCPUError(f"data file '{path}' lines {seen[0]} and {lineno}: labels {seen[1]!r} and {lab!r} "
                                   "are the same number spelled two ways, and other labels are not numbers; "
                                   "spell each label one way")
    return raw


def _task_names() -> tuple[str, ...]:
    from corecpu.tasks import TASKS  # tasks imports this module: resolve at call time

    return tuple(TASKS)


def is_task(spec: str) -> bool:
    """True when --data/--eval-data names a built-in task rather than a file."""
    return spec in _task_names()


def default_eval_spec(data_spec: str) -> str:
    """What --eval-data auto means: the held-out split of a built-in task, no evaluation for a file."""
    return data_spec if is_task(data_spec) else "none"


_OPTION_FLAGS = {"fmt": "--data-format", "has_header": "--no-header"}


def load_data(spec: str, *, split: str = "train", seed: int = 0, label_names: Sequence[str] | None = None,
              **file_options: Any) -> ClassificationData:
    """`spec` is a built-in task name (corecpu.tasks.TASKS), a file path, or a Hugging Face dataset
    (corecpu.hf_data); file_options go to load_file (fmt, *_column, has_header) and must stay unset for a task."""
    if not is_task(spec):
        from corecpu.hf_data import is_hf_source, load_hf_dataset  # Parquet/Arrow/save_to_disk via datasets

        if is_hf_source(spec):
            return load_hf_dataset(spec, split=split, label_names=label_names, **file_options)
        return load_file(spec, label_names=label_names, **file_options)
    from corecpu.tasks import task_dataset

    used = [k for k, v in file_options.items() if v not in (None, True)]
    if used:
        flag = _OPTION_FLAGS.get(used[0], "--" + used[0].replace("_", "-"))
        raise CoreCPUError(f"{flag} does not apply to the built-in task --data {spec}; drop it or pass --data PATH")
    data = task_dataset(spec, split, seed=seed)
    if label_names is not None and list(label_names) != data.label_names:
        raise CoreCPUError(f"the built-in task {spec} has labels {data.label_names}, the training data "
                           f"{list(label_names)}; use the same task for --data and --eval-data, or files for both")
    return data


# ---------------------------------------------------------------- tokenization

class TokenizedDataset(Dataset):
    """Tokenizes everything once (truncating, not padding); items are dicts of int lists."""

    def __init__(self, data: ClassificationData, tokenizer: Any, max_seq_len: int) -> None:
        specials = tokenizer.num_special_tokens_to_add(pair=data.text_pairs is not None)
        if max_seq_len <= specials + 1:
            raise CoreCPUError(f"max sequence length {max_seq_len} leaves no room for text after {specials} "
                               "special tokens; pass a larger --max-seq-len (e.g. 128)")
        enc = tokenizer(data.texts, data.text_pairs, truncation=True, max_length=max_seq_len, padding=False)
        self.input_ids: list[list[int]] = enc["input_ids"]
        self.token_type_ids: list[list[int]] | None = enc.get("token_type_ids")
        self.labels = data.labels
        self.label_names = data.label_names
        self.tokenizer = tokenizer
        self.max_seq_len = max_seq_len
        # Upper bound on truncated examples (an untruncated one can be exactly max long).
        self.num_at_max_len = sum(len(ids) >= max_seq_len for ids in self.input_ids)

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def lengths(self) -> list[int]:
        """Tokens per example (after truncation): what length grouping sorts by."""
        return [len(ids) for ids in self.input_ids]

    def __getitem__(self, key: int | tuple[int, bool]) -> dict[str, Any]:
        # EvalShardSampler yields (index, valid) so filler items reach collate marked invalid.
        i, valid = key if isinstance(key, tuple) else (key, True)
        item: dict[str, Any] = {"input_ids": self.input_ids[i], "labels": self.labels[i], "valid": valid}
        if self.token_type_ids is not None:
            item["token_type_ids"] = self.token_type_ids[i]
        return item


def padded_width(longest: int, pad_to_multiple_of: int = 0, max_len: int | None = None) -> int:
    """Batch width: the longest item rounded up to a multiple of N, but never past max_len.
    The cap keeps widths within the model's position embeddings (a 512-token model with
    N=48 would otherwise get 528) and costs at most one extra shape: max_len itself."""
    if pad_to_multiple_of <= 1:
        return longest
    width = -(-longest // pad_to_multiple_of) * pad_to_multiple_of
    return width if max_len is None else max(longest, min(width, max_len))


def make_collate(tokenizer: Any, pad_to_multiple_of: int = 0,
                 max_len: int | None = None) -> Callable[[list[dict[str, Any]]], dict[str, Any]]:
    """Pad to the longest item in the batch (rounded up by `padded_width`); adds META_KEYS
    (see module docstring)."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    left = getattr(tokenizer, "padding_side", "right") == "left"

    def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
        lengths = [len(it["input_ids"]) for it in items]
        width = padded_width(max(lengths), pad_to_multiple_of, max_len)
        ids = torch.full((len(items), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        types = torch.zeros((len(items), width), dtype=torch.long) if "token_type_ids" in items[0] else None
        for row, (it, n) in enumerate(zip(items, lengths)):
            cols = slice(width - n, width) if left else slice(0, n)
            ids[row, cols] = torch.tensor(it["input_ids"], dtype=torch.long)
            mask[row, cols] = 1
            if types is not None:
                types[row, cols] = torch.tensor(it["token_type_ids"], dtype=torch.long)
        batch: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
        if types is not None:
            batch["token_type_ids"] = types
        batch["labels"] = torch.tensor([it["labels"] for it in items], dtype=torch.long)
        batch["num_tokens"] = sum(lengths)
        batch["num_padded"] = width * len(items) - sum(lengths)
        batch["valid"] = torch.tensor([it.get("valid", True) for it in items], dtype=torch.bool)
        return batch

    return collate


# Names that lived here before the split into tasks.py and sampling.py; resolved lazily
# because both modules import this one.
_MOVED = {"builtin_dataset": "tasks", "write_builtin": "tasks", "build_loader": "sampling",
          "build_eval_loader": "sampling", "set_epoch": "sampling", "steps_per_epoch": "sampling",
          "ResumableDistributedSampler": "sampling", "EvalShardSampler": "sampling"}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        import importlib

        return getattr(importlib.import_module(f"corecpu.{_MOVED[name]}"), name)
    raise AttributeError(f"module 'corecpu.data' has no attribute {name!r}")
