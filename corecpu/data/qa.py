"""Extractive question answering examples (SQuAD v1.1 / v2.0) from files, checked at load.

Three sources, one example type, one set of one-line errors:

    load_squad_json(path)             the official nested SQuAD JSON (v1.1 and v2.0)
    load_qa_jsonl(path)               one flat row per line: id, question, context,
                                      answers {"text": [...], "answer_start": [...]}
    load_qa_hf(spec, split="train")   the same flat rows as Parquet/Arrow/save_to_disk (HF `squad`)
    load_qa(spec, split=...)          whichever of the three `spec` names

Every answer must sit in its context where answer_start says (a wrong offset trains the model
on the wrong span without any error). A question without answers is unanswerable (SQuAD v2.0);
it is an error unless `allow_impossible`, so v1.1 data with a lost answer is not silently
turned into a "no answer" label. Torch-free; `datasets` is imported only for its sources.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corecpu.data.columns import short
from corecpu.data.files import read_text
from corecpu.data.hf import open_dataset, is_hf_source
from corecpu.errors import CoreCPUError

V2_FLAG = "--version-2-with-negative"  # what tells corecpu that unanswerable questions are expected
COLUMN_FLAGS = "--id-column, --question-column, --context-column and --answers-column"
JSONL_SUFFIXES = (".jsonl", ".json-lines")


@dataclass(frozen=True)
class QAExample:
    id: str
    question: str
    context: str
    answer_texts: tuple[str, ...] = ()
    answer_starts: tuple[int, ...] = ()  # character offsets into context, one per answer text

    @property
    def is_impossible(self) -> bool:
        """No answer in the context (SQuAD v2.0): the model should point at the CLS token."""
        return not self.answer_texts


@dataclass
class QAData:
    examples: list[QAExample]
    source: str  # for logs and model cards: the path (and split) the examples came from

    def __len__(self) -> int:
        return len(self.examples)


def _clip(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")  # repr keeps a newline on one line


def _example(where: str, qid: Any, question: Any, context: Any, texts: Any, starts: Any,
             allow_impossible: bool) -> QAExample:
    """One checked example; `where` names the file and row for the error messages."""
    if isinstance(qid, bool) or not isinstance(qid, (str, int)) or not str(qid).strip():
        raise CoreCPUError(f"{where}: the question id must be a non-empty string, found {qid!r}; give every "
                           "question a unique id")
    qid = str(qid)
    where = f"{where} question id {qid!r}"
    for name, value in (("question", question), ("context", context)):
        if not isinstance(value, str):
            raise CoreCPUError(f"{where}: the {name} must be a string, found {type(value).__name__}; fix the row")
        if not value.strip():
            raise CoreCPUError(f"{where}: empty {name}; fix or drop the question")
    if not isinstance(texts, (list, tuple)) or not isinstance(starts, (list, tuple)) or len(texts) != len(starts):
        raise CoreCPUError(f"{where}: answers need as many texts as answer_starts (found {_clip(str(texts))} and "
                           f"{_clip(str(starts))}); give each answer its text and start")
    for text, start in zip(texts, starts):
        if isinstance(start, float) and start.is_integer():
            start = int(start)  # JSON written by pandas spells 12 as 12.0
        if not isinstance(text, str) or not text.strip():
            raise CoreCPUError(f"{where}: empty answer text {text!r}; fix the answer or drop it")
        if isinstance(start, bool) or not isinstance(start, int):
            raise CoreCPUError(f"{where}: answer_start must be an integer, found {start!r}; give the answer's "
                               "character offset in the context")
        end = start + len(text)
        if start < 0 or end > len(context):
            raise CoreCPUError(f"{where}: answer {_clip(text)} at answer_start {start} runs outside the context "
                               f"({len(context)} characters); fix the offset")
        if context[start:end] != text:
            found = context.find(text)
            hint = f"; the text occurs at offset {found}" if found >= 0 else ""
            raise CoreCPUError(f"{where}: answer_start {start} does not point at the answer text {_clip(text)} "
                               f"(the context has {_clip(context[start:end])} there{hint}); fix the offset or the text")
    if not texts and not allow_impossible:
        raise CoreCPUError(f"{where}: the question has no answer; pass {V2_FLAG} for SQuAD v2.0-style data with "
                           "unanswerable questions, or add its answer")
    return QAExample(qid, question, context, tuple(texts), tuple(int(s) for s in starts))


def _unique(examples: list[QAExample], source: str) -> QAData:
    if not examples:
        raise CoreCPUError(f"data '{source}' has no questions; pass a file with at least one")
    seen: set[str] = set()
    for ex in examples:
        if ex.id in seen:
            raise CoreCPUError(f"data '{source}': question id {ex.id!r} appears more than once; give every question "
                               "a unique id (scores are kept by id)")
        seen.add(ex.id)
    return QAData(examples, source)


# ---------------------------------------------------------------- SQuAD JSON

def _field(obj: Any, key: str, kind: type, where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        keys = short(list(obj)) if isinstance(obj, dict) else type(obj).__name__
        raise CoreCPUError(f"{where}: missing {key!r} (found {keys}); SQuAD JSON is "
                           '{"data": [{"paragraphs": [{"context": ..., "qas": [{"id", "question", "answers"}]}]}]}')
    if not isinstance(obj[key], kind):
        raise CoreCPUError(f"{where}: {key!r} must be a {kind.__name__}, found {type(obj[key]).__name__}; "
                           "fix the file's structure")
    return obj[key]


def load_squad_json(path: str | Path, *, allow_impossible: bool = False) -> QAData:
    """The questions of an official SQuAD v1.1 or v2.0 JSON file, in file order."""
    path = Path(path)
    if not path.is_file():
        raise CoreCPUError(f"data file '{path}' not found; pass a SQuAD JSON file")
    try:
        doc = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        hint = "; a file with one example per line must be named .jsonl" if exc.msg == "Extra data" else ""
        raise CoreCPUError(f"data file '{path}' line {exc.lineno}: invalid JSON ({exc.msg}){hint}") from None
    where = f"data file '{path}'"
    examples = []
    for a, article in enumerate(_field(doc, "data", list, where)):
        for p, para in enumerate(_field(article, "paragraphs", list, f"{where} data[{a}]")):
            at = f"{where} data[{a}].paragraphs[{p}]"
            context = _field(para, "context", str, at)
            for q, qa in enumerate(_field(para, "qas", list, at)):
                qid = _field(qa, "id", object, f"{at}.qas[{q}]")
                at_q = f"{where} question id {str(qid)!r}"
                answers = _field(qa, "answers", list, at_q)
                if qa.get("is_impossible") is True and answers:
                    raise CoreCPUError(f"{at_q}: is_impossible is true but the question has answers ({len(answers)}); "
                                       "move them to plausible_answers or set is_impossible to false")
                texts = [_field(ans, "text", object, f"{at_q} answer {i}") for i, ans in enumerate(answers)]
                starts = [_field(ans, "answer_start", object, f"{at_q} answer {i}") for i, ans in enumerate(answers)]
                examples.append(_example(where, qid, _field(qa, "question", object, at_q), context, texts, starts,
                                         allow_impossible))
    return _unique(examples, str(path))


def write_squad_json(path: str | Path, examples: Sequence[QAExample], *, version: str | None = None,
                     title: str = "corecpu") -> int:
    """Write examples as SQuAD JSON that load_squad_json reads back equal; returns the question count.

    Consecutive questions on one context share a paragraph. The version is "2.0" when any
    question is unanswerable (each question then carries is_impossible), else "1.1".
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise CoreCPUError(f"cannot write '{path}': directory '{path.parent}' does not exist; create it first")
    version = version or ("2.0" if any(ex.is_impossible for ex in examples) else "1.1")
    if version == "1.1" and any(ex.is_impossible for ex in examples):
        bad = next(ex.id for ex in examples if ex.is_impossible)
        raise CoreCPUError(f"cannot write question id {bad!r} to SQuAD v1.1: it has no answer; write version 2.0")
    paragraphs: list[dict[str, Any]] = []
    for ex in examples:
        if not paragraphs or paragraphs[-1]["context"] != ex.context:
            paragraphs.append({"context": ex.context, "qas": []})
        qa: dict[str, Any] = {"id": ex.id, "question": ex.question,
                              "answers": [{"text": t, "answer_start": s}
                                          for t, s in zip(ex.answer_texts, ex.answer_starts)]}
        if version != "1.1":
            qa["is_impossible"] = ex.is_impossible
        paragraphs[-1]["qas"].append(qa)
    doc = {"version": version, "data": [{"title": title, "paragraphs": paragraphs}]}
    path.write_text(json.dumps(doc, ensure_ascii=False) + "\n", encoding="utf-8")
    return len(examples)


def gold_answers(examples: Iterable[QAExample]) -> dict[str, list[str]]:
    """{question id: answer texts} for scoring; [] for an unanswerable question."""
    return {ex.id: list(ex.answer_texts) for ex in examples}


# ---------------------------------------------------------------- flat rows (JSONL, Hugging Face)

def _answers(value: Any, where: str) -> tuple[Any, Any]:
    """(texts, starts) from {"text": [...], "answer_start": [...]} or a list of {"text", "answer_start"}."""
    if isinstance(value, dict) and "text" in value and "answer_start" in value:
        return value["text"], value["answer_start"]
    if isinstance(value, list) and all(isinstance(a, dict) and "text" in a and "answer_start" in a for a in value):
        return [a["text"] for a in value], [a["answer_start"] for a in value]
    raise CoreCPUError(f"{where}: answers must look like {{\"text\": [...], \"answer_start\": [...]}}, found "
                       f"{_clip(str(value))}; fix the row or pick the answers column with --answers-column")


def _rows_to_data(rows: Iterator[tuple[str, dict[str, Any]]], columns: tuple[str, str, str, str],
                  allow_impossible: bool, source: str) -> QAData:
    examples = []
    for where, row in rows:
        missing = [c for c in columns if c not in row]
        if missing:
            raise CoreCPUError(f"{where}: missing {missing[0]!r} (keys here: {short(list(row))}); pick the columns "
                               f"with {COLUMN_FLAGS}")
        qid, question, context, answers = (row[c] for c in columns)
        texts, starts = _answers(answers, where)
        examples.append(_example(where, qid, question, context, texts, starts, allow_impossible))
    return _unique(examples, source)


def load_qa_jsonl(path: str | Path, *, id_column: str = "id", question_column: str = "question",
                  context_column: str = "context", answers_column: str = "answers",
                  allow_impossible: bool = False) -> QAData:
    """Flat rows, one JSON object per line, as Hugging Face's `squad` dataset spells them."""
    path = Path(path)
    if not path.is_file():
        raise CoreCPUError(f"data file '{path}' not found; pass a JSONL file with one question per line")

    def rows() -> Iterator[tuple[str, dict[str, Any]]]:
        for lineno, line in enumerate(read_text(path).splitlines(), 1):
            if not line.strip():
                continue
            where = f"data file '{path}' line {lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CoreCPUError(f"{where}: invalid JSON ({exc.msg}); each line must be one JSON object") from None
            if not isinstance(obj, dict):
                raise CoreCPUError(f"{where}: expected a JSON object, found {type(obj).__name__}; write one object "
                                   'per line: {"id", "question", "context", "answers"}')
            yield where, obj

    columns = (id_column, question_column, context_column, answers_column)
    return _rows_to_data(rows(), columns, allow_impossible, str(path))


def load_qa_hf(spec: str | Path, *, split: str = "train", id_column: str = "id", question_column: str = "question",
               context_column: str = "context", answers_column: str = "answers",
               allow_impossible: bool = False) -> QAData:
    """Flat rows from a Parquet or Arrow file or a save_to_disk directory (read offline, no cache copy)."""
    path = Path(spec)
    if not path.exists():
        raise CoreCPUError(f"data '{path}' not found; pass a Parquet/Arrow file or a save_to_disk directory")
    ds = open_dataset(path, split)
    columns = (id_column, question_column, context_column, answers_column)
    absent = [c for c in columns if c not in ds.column_names]
    if absent:
        raise CoreCPUError(f"data '{path}' ({split}): no column {absent[0]!r} (available columns: "
                           f"{short(list(ds.column_names))}); pick the columns with {COLUMN_FLAGS}")
    # Whole columns at once: row-by-row access to a memory-mapped dataset is ~100x slower.
    values = [list(ds[c]) for c in columns]
    rows = ((f"data '{path}' ({split}) row {i}", dict(zip(columns, row))) for i, row in enumerate(zip(*values)))
    return _rows_to_data(rows, columns, allow_impossible, f"{path}:{split}")


def load_qa(spec: str | Path, *, split: str = "train", allow_impossible: bool = False, **columns: str) -> QAData:
    """SQuAD JSON (.json), flat JSONL (.jsonl) or a Hugging Face dataset; `columns` go to the flat loaders."""
    path = Path(spec)
    suffix = path.suffix.lower()
    if suffix == ".json":
        if columns:
            raise CoreCPUError(f"{COLUMN_FLAGS} do not apply to the SQuAD JSON file '{path}'; drop them")
        return load_squad_json(path, allow_impossible=allow_impossible)
    if suffix in JSONL_SUFFIXES:
        return load_qa_jsonl(path, allow_impossible=allow_impossible, **columns)
    if is_hf_source(path):
        return load_qa_hf(path, split=split, allow_impossible=allow_impossible, **columns)
    if not path.exists():
        raise CoreCPUError(f"data '{path}' not found; pass a SQuAD .json, a .jsonl, a Parquet/Arrow file or a "
                           "save_to_disk directory")
    raise CoreCPUError(f"data '{path}': cannot tell the format; use a SQuAD .json file, a .jsonl file with one "
                       "question per line, a .parquet/.arrow file or a save_to_disk directory")
