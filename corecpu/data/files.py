"""Classification examples from TSV, CSV and JSONL files, with one-line errors that name the row and the fix."""

from __future__ import annotations

import csv
import io
import itertools
import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Any, Iterator, Sequence

from corecpu.data.builtin import TASKS
from corecpu.data.columns import COLUMN_FLAGS, Column, check_labels, infer_columns, short
from corecpu.data.types import ClassificationData
from corecpu.errors import CoreCPUError

FORMATS = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json-lines": "jsonl"}
FORMAT_CHOICES = ("auto", "tsv", "csv", "jsonl")  # --data-format
# csv's default field limit is 128 KiB; a long document in one cell is legitimate training data.
FIELD_LIMIT = 256 * 1024 * 1024
_COMPRESSED = {b"\x1f\x8b": ("gzip", "gunzip"), b"BZh": ("bzip2", "bunzip2"), b"\xfd7zXZ": ("xz", "unxz"),
               b"(\xb5/\xfd": ("zstd", "unzstd"), b"PK\x03\x04": ("zip", "unzip")}


# Longest first: UTF-32-LE's BOM begins with UTF-16-LE's. Each codec drops its own BOM.
_BOMS = ((b"\xff\xfe\x00\x00", "utf-32"), (b"\x00\x00\xfe\xff", "utf-32"), (b"\xff\xfe", "utf-16"),
         (b"\xfe\xff", "utf-16"), (b"\xef\xbb\xbf", "utf-8-sig"))


def read_text(path: Path) -> str:
    """The file's text: UTF-8, or UTF-16/32 when a byte-order mark says so (a BOM is dropped); a bad byte
    is reported by line and column, with the `iconv -f` that fits what the bytes look like."""
    raw = path.read_bytes()
    for magic, (kind, tool) in _COMPRESSED.items():
        if raw.startswith(magic):
            raise CoreCPUError(f"data file '{path}' is {kind}-compressed, not text; decompress it first "
                               f"({tool} {path.name}) and pass the decompressed file")
    codec = next((c for bom, c in _BOMS if raw.startswith(bom)), "utf-8-sig")
    try:
        text = raw.decode(codec)
    except UnicodeDecodeError as exc:
        if codec != "utf-8-sig":  # the BOM said UTF-16/32 and the rest disagrees: no line numbers in those bytes
            raise CoreCPUError(f"data file '{path}' starts with a {codec.upper()} byte-order mark but is not valid "
                               f"{codec.upper()} ({exc.reason} at byte {exc.start}); re-export it as UTF-8") from None
        line_start = raw.rfind(b"\n", 0, exc.start) + 1
        lineno = raw.count(b"\n", 0, exc.start) + 1
        raise CoreCPUError(f"data file '{path}' line {lineno}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at byte "
                           f"{exc.start - line_start + 1} of the line: {exc.reason}); convert the file to UTF-8, "
                           f"e.g. {_iconv_hint(raw, path)}") from None
    if codec == "utf-8-sig" and "\x00" in text:  # valid UTF-8, but text files have no NULs: UTF-16 without a BOM
        lineno = text.count("\n", 0, text.index("\x00")) + 1
        raise CoreCPUError(f"data file '{path}' line {lineno}: NUL bytes, so not UTF-8 text; convert the file to "
                           f"UTF-8, e.g. {_iconv_hint(raw, path)}")
    return text


def _iconv_hint(raw: bytes, path: Path) -> str:
    """UTF-16 without a BOM shows as a NUL beside every ASCII character; latin1 is only a guess for the rest."""
    head = raw[:4096]
    if head.count(0) * 4 >= len(head):  # a quarter NULs: no 8-bit text looks like that
        even, odd = head[0::2].count(0), head[1::2].count(0)
        return f"iconv -f {'UTF-16BE' if even > odd else 'UTF-16LE'} -t UTF-8 {path.name}"
    return f"iconv -f latin1 -t utf-8 {path.name} (if it is latin1; `file {path.name}` may name its encoding)"


def _records(path: Path, fmt: str) -> Iterator[tuple[int, Any]]:
    """Yield (starting line number, row) for non-blank rows; rows are lists (tsv/csv) or dicts."""
    with io.StringIO(read_text(path), newline="") as fh:
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
        csv.field_size_limit(FIELD_LIMIT)
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
        raise CoreCPUError(f"data file '{path}': no {what} key {col!r} in the first line (keys: {short(header)}); "
                           f"pass {flag} with one of those keys")
    if isinstance(col, int) or str(col).isdigit():
        if header is not None and int(col) >= len(header):  # type: ignore[arg-type]
            raise CoreCPUError(f"data file '{path}': {what} column index {col} is out of range (the file has "
                               f"{len(header)} columns: {short(header)}); pass {flag} with a valid name or index")
        return int(col)  # type: ignore[arg-type]
    avail = f"available columns: {short(header)}" if header else "the file has no header, so use 0-based indices"
    raise CoreCPUError(f"data file '{path}': no {what} column named {col!r} ({avail}); pass {flag} NAME_OR_INDEX")


def load_file(path: str | Path, *, fmt: str | None = None, text_column: Column = None,
              text_pair_column: Column = None, label_column: Column = None, has_header: bool = True,
              label_names: Sequence[str] | None = None) -> ClassificationData:
    """Load a TSV/CSV/JSONL classification file.

    Pass the training set's `label_names` when loading an eval file so label ids agree;
    labels the training set never had are then an error instead of a silent new class.
    """
    path = Path(path)
    if path.is_dir():
        raise CoreCPUError(f"data '{path}' is a directory, and not a saved Hugging Face dataset (no dataset_info.json "
                           "or dataset_dict.json in it); pass a TSV, CSV, JSONL, Parquet or Arrow file, or a "
                           "save_to_disk directory")
    if not path.is_file():
        raise CoreCPUError(f"data file '{path}' not found; pass --data PATH to a TSV, CSV or JSONL file, "
                           f"or a built-in task: --data {' or '.join(TASKS)}")
    if fmt is None and path.suffix.lower() not in FORMATS:
        raise CoreCPUError(f"data file '{path}': cannot tell the format from extension {path.suffix!r}; "
                           "rename it to .tsv, .csv or .jsonl, or pass --data-format tsv|csv|jsonl")
    fmt = (fmt or FORMATS[path.suffix.lower()]).lower()
    if fmt not in ("tsv", "csv", "jsonl"):
        raise CoreCPUError(f"unknown data format {fmt!r}; pass --data-format tsv, csv or jsonl")
    texts, pairs, raw = _parse(path, fmt, (text_column, text_pair_column, label_column), has_header)
    raw = canonical_labels(raw, path)
    notes = check_labels([(f"line {lineno}", lab) for lineno, lab in raw], str(path))
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
                               f"labels ({short(names)}); use an eval file with the same label set")
    return ClassificationData(texts, pairs, [index[lab] for _, lab in raw], names, str(path), notes)


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
        twice = sorted({h for h in header if header.count(h) > 1})
        if twice:
            raise CoreCPUError(f"data file '{path}': the header names column {twice[0]!r} twice; rename one of them")
    else:
        rows = itertools.chain([first], rows)
    if header is not None:
        columns = infer_columns(header, *columns, path)
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
                raise CoreCPUError(f"{where}: missing key {missing[0]!r} (keys here: {short(list(row))}); "
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
