"""Causal-LM training data (plain text, prompt/completion pairs or chat conversations) from local files,
checked at load with one-line errors that name the file, the row and the fix. Torch-free.

    read_causal_data(spec, split="train") -> CausalData

Sources: `.txt` (one document per non-empty line), `.jsonl`/`.json` (JSON lines, or one JSON list of
objects), and through `datasets` (corecpu.data.hf) `.parquet`/`.arrow` files and save_to_disk
directories. The kind follows the columns: `messages` first, then `prompt` + `completion`, then
`text`; a column flag names the column and fixes the kind.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from corecpu.data.columns import short
from corecpu.data.files import read_text
from corecpu.data.hf import is_hf_source, open_dataset
from corecpu.errors import CoreCPUError

KINDS = ("text", "prompt_completion", "messages")
ROLES = ("system", "user", "assistant")
FORMAT_CHOICES = ("auto", "txt", "jsonl", "json")  # json = jsonl: both read JSON lines or a JSON list
SUFFIXES = {".txt": "txt", ".jsonl": "jsonl", ".json-lines": "jsonl", ".json": "jsonl"}
COLUMN_FLAGS = "--messages-column, --prompt-column with --completion-column, or --text-column"
# A turn is a (role, content) pair; a conversation is a tuple of them.
Turn = tuple[str, str]


@dataclass(frozen=True)
class CausalData:
    """Checked examples of one kind. `rows` holds, by kind:
      text              str                                    one document each
      prompt_completion (prompt, completion) str pairs        the loss may skip the prompt
      messages          tuple of (role, content) str pairs    roles among ROLES, at least one assistant turn
    Strings are kept exactly as read (a completion's leading space matters to the tokenizer)."""

    kind: str
    rows: tuple
    source: str  # the path (and split, for Hugging Face data): for logs and model cards
    notes: tuple[str, ...] = ()  # one line each, worth a warning at start-up

    def __len__(self) -> int:
        return len(self.rows)


def read_causal_data(spec: str, *, split: str, fmt: str = "auto", text_column: str = "", prompt_column: str = "",
                     completion_column: str = "", messages_column: str = "") -> CausalData:
    """Read and check `spec`. `split` ("train" or "eval") picks a DatasetDict's split (corecpu.data.hf.SPLITS)
    and names the data in messages; a file is read whole whatever the split."""
    path = Path(spec)
    columns = {"text": text_column, "prompt": prompt_column, "completion": completion_column,
               "messages": messages_column}
    if fmt not in FORMAT_CHOICES:
        raise CoreCPUError(f"unknown data format {fmt!r} for causal-LM data; pass --data-format "
                           f"{'|'.join(FORMAT_CHOICES)}")
    if is_hf_source(path):
        if fmt != "auto":
            raise CoreCPUError(f"--data-format {fmt} does not apply to the Hugging Face dataset '{path}'; drop it")
        if not path.exists():
            raise CoreCPUError(f"data '{path}' not found; pass a .txt, .jsonl, .json, .parquet or .arrow file "
                               "or a save_to_disk directory")
        return _from_table(path, split, columns)
    if path.is_dir():
        raise CoreCPUError(f"data '{path}' is a directory, and not a saved Hugging Face dataset (no dataset_info.json "
                           "or dataset_dict.json in it); pass a .txt, .jsonl, .json, .parquet or .arrow file, or a "
                           "save_to_disk directory")
    if not path.is_file():
        raise CoreCPUError(f"data file '{path}' not found; pass a .txt, .jsonl, .json, .parquet or .arrow file or "
                           "a save_to_disk directory")
    kind_of_file = fmt if fmt != "auto" else SUFFIXES.get(path.suffix.lower())
    if kind_of_file is None:
        raise CoreCPUError(f"data file '{path}': cannot tell the format from extension {path.suffix!r}; rename it "
                           "to .txt, .jsonl, .json, .parquet or .arrow, or pass --data-format txt|jsonl")
    if kind_of_file == "txt":
        return _from_lines(path, split, columns)
    return _from_json(path, split, columns)


# ---------------------------------------------------------------- sources

def _from_lines(path: Path, split: str, columns: dict[str, str]) -> CausalData:
    given = [name for name, col in columns.items() if col]
    if given:
        raise CoreCPUError(f"--{given[0]}-column does not apply to the text file '{path}' (one document per line); "
                           "drop it, or pass a JSONL/Parquet file with columns")
    docs = tuple(line for line in read_text(path).splitlines() if line.strip())
    if not docs:
        raise CoreCPUError(f"{split} data '{path}' has no non-empty lines; pass a file with one document per line")
    return CausalData("text", docs, str(path))


def _json_rows(path: Path, split: str) -> Iterator[tuple[str, Any]]:
    """(where, row) for every object of a JSON-lines file or a JSON list; `where` names file and line/row."""
    text = read_text(path)
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CoreCPUError(f"{split} data '{path}' line {exc.lineno}: invalid JSON ({exc.msg}); a file starting "
                               "with '[' must be one JSON list of objects") from None
        yield from ((f"{split} data '{path}' row {i}", row) for i, row in enumerate(rows, 1))
        return
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield f"{split} data '{path}' line {lineno}", json.loads(line)
        except json.JSONDecodeError as exc:
            raise CoreCPUError(f"{split} data '{path}' line {lineno}: invalid JSON ({exc.msg}); write one JSON "
                               "object per line, or the whole file as one JSON list of objects") from None


def _from_json(path: Path, split: str, columns: dict[str, str]) -> CausalData:
    rows = list(_json_rows(path, split))
    if not rows:
        raise CoreCPUError(f"{split} data '{path}' has no rows; pass a file with one JSON object per line")
    for where, row in rows:
        if not isinstance(row, dict):
            raise CoreCPUError(f"{where}: expected a JSON object, found {type(row).__name__}; write objects such as "
                               '{"text": ...}, {"prompt": ..., "completion": ...} or {"messages": [...]}')
    kind, names = _kind(list(rows[0][1]), columns, f"{split} data '{path}'")
    values = []
    for where, row in rows:
        missing = [n for n in names if n not in row]
        if missing:
            raise CoreCPUError(f"{where}: no {missing[0]!r} key (keys here: {short(list(row))}); give every row the "
                               f"same keys, or pick them with {COLUMN_FLAGS}")
        values.append((where, [row[n] for n in names]))
    return _checked(kind, values, str(path))


def _from_table(path: Path, split: str, columns: dict[str, str]) -> CausalData:
    ds = open_dataset(path, split)  # one-line errors, pip install 'corecpu[datasets]' when missing
    if not len(ds):
        raise CoreCPUError(f"{split} data '{path}' has no rows; pass a dataset with at least one row")
    kind, names = _kind(list(ds.column_names), columns, f"{split} data '{path}'")
    # Whole columns at once: row-by-row access to a memory-mapped dataset is ~100x slower.
    table = [list(ds[n]) for n in names]
    values = [(f"{split} data '{path}' row {i}", list(v)) for i, v in enumerate(zip(*table), 1)]
    return _checked(kind, values, f"{path}:{split}")


# ---------------------------------------------------------------- columns and checks

def _kind(keys: list[str], columns: dict[str, str], what: str) -> tuple[str, list[str]]:
    """(kind, column names in row order) from the file's keys; flags win over the default names."""
    given = {k for k, v in columns.items() if v}
    if given & {"prompt", "completion"}:
        kind = "prompt_completion"
    elif given:
        kind = "messages" if "messages" in given else "text"
    else:
        kind = next((k for k, needs in (("messages", ["messages"]), ("prompt_completion", ["prompt", "completion"]),
                                        ("text", ["text"])) if all(n in keys for n in needs)), "")
        if not kind:
            raise CoreCPUError(f"{what}: no 'messages', 'prompt' + 'completion' or 'text' column (columns: "
                               f"{short(keys)}); name yours with {COLUMN_FLAGS}")
    extra = given - set(_NEEDS[kind])
    if extra:
        raise CoreCPUError(f"{what}: --{sorted(extra)[0]}-column and --{sorted(given - extra)[0]}-column pick "
                           "different kinds of data; pass the columns of one kind only")
    names = [columns[c] or c for c in _NEEDS[kind]]
    absent = [n for n in names if n not in keys]
    if absent:
        raise CoreCPUError(f"{what}: no column {absent[0]!r} (columns: {short(keys)}); pick one of those with "
                           f"{COLUMN_FLAGS}")
    return kind, names


_NEEDS = {"text": ("text",), "prompt_completion": ("prompt", "completion"), "messages": ("messages",)}


def _string(value: Any, name: str, where: str) -> str:
    if not isinstance(value, str):
        raise CoreCPUError(f"{where}: {name} must be a string, found {type(value).__name__}; fix the row or pick "
                           f"another column with {COLUMN_FLAGS}")
    if not value.strip():
        raise CoreCPUError(f"{where}: empty {name}; fix or drop the row")
    return value


def _conversation(value: Any, where: str) -> tuple[Turn, ...]:
    """The checked (role, content) turns; keys other than role and content are dropped."""
    if not isinstance(value, (list, tuple)) or not value:
        raise CoreCPUError(f"{where}: messages must be a non-empty list of {{\"role\", \"content\"}} objects, found "
                           f"{_clip(value)}; fix or drop the row")
    turns = []
    for j, msg in enumerate(value, 1):
        if not isinstance(msg, dict) or "role" not in msg or "content" not in msg:
            raise CoreCPUError(f"{where}: message {j} is not a {{\"role\", \"content\"}} object ({_clip(msg)}); "
                               "fix or drop the row")
        role, content = msg["role"], msg["content"]
        if role not in ROLES:
            raise CoreCPUError(f"{where}: message {j} has role {_clip(role)}; use system, user or assistant "
                               "(or drop that message)")
        if not isinstance(content, str):
            raise CoreCPUError(f"{where}: message {j} content must be a string, found {type(content).__name__}; "
                               "fix or drop the row")
        if role == "assistant" and not content.strip():
            raise CoreCPUError(f"{where}: message {j} is an empty assistant turn; write the reply or drop the turn")
        turns.append((role, content))
    if not any(role == "assistant" for role, _ in turns):
        raise CoreCPUError(f"{where}: no assistant turn, so nothing to train on; add the assistant's reply or drop "
                           "the row")
    return tuple(turns)


def _checked(kind: str, values: list[tuple[str, list[Any]]], source: str) -> CausalData:
    if kind == "text":
        rows: tuple = tuple(_string(v[0], "text", where) for where, v in values)
        return CausalData(kind, rows, source)
    if kind == "prompt_completion":
        rows = tuple((_string(p, "prompt", where), _string(c, "completion", where)) for where, (p, c) in values)
        return CausalData(kind, rows, source)
    rows = tuple(_conversation(v[0], where) for where, v in values)
    trailing = sum(conv[-1][0] != "assistant" for conv in rows)
    notes = (f"data '{source}': {trailing} of {len(rows)} conversations end with a user or system turn, which "
             "trains nothing; end them with the assistant's reply",) if trailing else ()
    return CausalData(kind, rows, source, notes)


def _clip(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
