"""Tier 1: causal-LM data from .txt, JSONL/JSON, Parquet, Arrow and save_to_disk (corecpu.data.causal_records):
the kind each file's columns give, and one-line errors that name the file, the row and the fix."""

from __future__ import annotations

import json
import sys

import pytest

from corecpu.data.causal_records import CausalData, read_causal_data
from helpers.one_line import one_line_error

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."}]
CHAT_ROW = (("system", "Be brief."), ("user", "Capital of France?"), ("assistant", "Paris."))


def jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def read(spec, **kw) -> CausalData:
    return read_causal_data(str(spec), split=kw.pop("split", "train"), **kw)


# ---------------------------------------------------------------- formats and kinds

def test_txt_is_one_document_per_non_empty_line(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("the first document\n\n   \n  the second, spaces kept \r\nthird\n")
    data = read(path)
    assert data == CausalData("text", ("the first document", "  the second, spaces kept ", "third"), str(path))
    assert len(data) == 3 and data.notes == ()
    other = tmp_path / "corpus.data"
    other.write_text("one\n")
    assert read(other, fmt="txt").rows == ("one",)


def test_jsonl_kinds_follow_the_columns_in_order(tmp_path):
    text = read(jsonl(tmp_path / "t.jsonl", [{"text": "a b", "id": 1}, {"text": "c", "id": 2}]))
    assert (text.kind, text.rows) == ("text", ("a b", "c"))
    pc = read(jsonl(tmp_path / "pc.jsonl", [{"prompt": "Q: 2+2?", "completion": " 4", "text": "ignored"}]))
    assert (pc.kind, pc.rows) == ("prompt_completion", (("Q: 2+2?", " 4"),))  # the completion's space is kept
    chat = read(jsonl(tmp_path / "m.jsonl", [{"messages": CHAT, "prompt": "p", "completion": "c", "text": "t"}]))
    assert (chat.kind, chat.rows) == ("messages", (CHAT_ROW,))


def test_json_list_and_json_lines_in_a_json_file(tmp_path):
    listed = tmp_path / "list.json"
    rows = [{"prompt": "p1", "completion": "c1"}, {"prompt": "p2", "completion": "c2"}]
    listed.write_text(json.dumps(rows, indent=2))
    assert read(listed).rows == (("p1", "c1"), ("p2", "c2"))
    assert read(jsonl(tmp_path / "lines.json", [{"text": "x"}])).rows == ("x",)
    assert read(jsonl(tmp_path / "lines.ndjson", [{"text": "y"}]), fmt="jsonl").rows == ("y",)


def test_column_flags_override_the_default_names(tmp_path):
    path = jsonl(tmp_path / "d.jsonl", [{"text": "t", "body": "b", "q": "question", "a": "answer", "conv": CHAT}])
    assert read(path, text_column="body").rows == ("b",)
    assert read(path, prompt_column="q", completion_column="a").rows == (("question", "answer"),)
    assert read(path, messages_column="conv").rows == (CHAT_ROW,)
    half = jsonl(tmp_path / "half.jsonl", [{"prompt": "p", "answer": "a"}])
    assert read(half, completion_column="answer").rows == (("p", "a"),)  # the other column keeps its default name


def test_parquet_arrow_and_save_to_disk(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list([{"messages": CHAT}, {"messages": CHAT[1:]}])
    ds.to_parquet(str(tmp_path / "chat.parquet"))
    data = read(tmp_path / "chat.parquet")
    assert data.kind == "messages" and data.rows == (CHAT_ROW, CHAT_ROW[1:])
    assert data.source == f"{tmp_path / 'chat.parquet'}:train"
    ds.save_to_disk(str(tmp_path / "single"))
    arrow = next((tmp_path / "single").glob("*.arrow"))
    assert read(arrow).rows == data.rows and read(tmp_path / "single").rows == data.rows
    train = datasets.Dataset.from_dict({"prompt": ["a", "b"], "completion": ["1", "2"]})
    datasets.DatasetDict(train=train, validation=train.select([1])).save_to_disk(str(tmp_path / "dd"))
    assert read(tmp_path / "dd").rows == (("a", "1"), ("b", "2"))
    assert read(tmp_path / "dd", split="eval").rows == (("b", "2"),)


def test_a_conversation_ending_without_the_assistant_gives_a_note(tmp_path):
    open_end = CHAT + [{"role": "user", "content": "?"}]
    data = read(jsonl(tmp_path / "m.jsonl", [{"messages": CHAT}, {"messages": open_end}]))
    assert len(data.notes) == 1 and "1 of 2 conversations end with a user or system turn" in data.notes[0]


# ---------------------------------------------------------------- errors

def test_source_errors(tmp_path):
    one_line_error(lambda: read(tmp_path / "none.jsonl"), "not found", ".parquet")
    one_line_error(lambda: read(tmp_path / "none.parquet"), "not found", "save_to_disk")
    one_line_error(lambda: read(tmp_path), "is a directory", "save_to_disk")
    (tmp_path / "x.csv").write_text("text\nhi\n")
    one_line_error(lambda: read(tmp_path / "x.csv"), "extension '.csv'", "--data-format txt|jsonl")
    one_line_error(lambda: read(tmp_path / "x.csv", fmt="csv"), "unknown data format 'csv'")
    one_line_error(lambda: read(tmp_path / "x.parquet", fmt="jsonl"), "--data-format jsonl does not apply", "drop it")
    (tmp_path / "c.txt").write_text("doc\n")
    one_line_error(lambda: read(tmp_path / "c.txt", text_column="body"), "--text-column does not apply", "c.txt")


def test_empty_files(tmp_path):
    (tmp_path / "e.txt").write_text("\n  \n")
    one_line_error(lambda: read(tmp_path / "e.txt"), "e.txt' has no non-empty lines")
    (tmp_path / "e.jsonl").write_text("\n")
    one_line_error(lambda: read(tmp_path / "e.jsonl", split="eval"), "eval data", "e.jsonl' has no rows")
    (tmp_path / "e.json").write_text("[]")
    one_line_error(lambda: read(tmp_path / "e.json"), "has no rows")
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": []}).to_parquet(str(tmp_path / "e.parquet"))
    one_line_error(lambda: read(tmp_path / "e.parquet"), "e.parquet' has no rows")


def test_column_errors_list_the_columns_the_file_has(tmp_path):
    path = jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": "a"}])
    one_line_error(lambda: read(path), "no 'messages', 'prompt' + 'completion' or 'text' column",
                   "'question', 'answer'", "--prompt-column")
    one_line_error(lambda: read(path, prompt_column="question"), "no column 'completion'", "'question', 'answer'")
    one_line_error(lambda: read(path, text_column="body"), "no column 'body'", "'question', 'answer'")
    one_line_error(lambda: read(path, text_column="question", messages_column="answer"),
                   "--text-column and --messages-column pick different kinds")
    two = jsonl(tmp_path / "two.jsonl", [{"text": "a"}, {"body": "b"}])
    one_line_error(lambda: read(two), "line 2: no 'text' key", "'body'")


def test_column_errors_in_a_parquet_file(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"q": ["x"], "n": [1]}).to_parquet(str(tmp_path / "d.parquet"))
    one_line_error(lambda: read(tmp_path / "d.parquet"), "'q', 'n'", "--text-column")
    one_line_error(lambda: read(tmp_path / "d.parquet", text_column="n"), "row 1: text must be a string, found int")


def test_row_errors_name_the_file_and_row(tmp_path):
    cases = [
        ('{"text": "ok"}\n{"text": ', "line 2: invalid JSON"),
        ('{"text": "ok"}\n\n["a"]', "line 3: expected a JSON object, found list"),
        ('{"text": "ok"}\n{"text": "   "}', "line 2: empty text; fix or drop the row"),
        ('{"text": 7}', "line 1: text must be a string, found int"),
        ('{"prompt": "p", "completion": ""}', "line 1: empty completion"),
        ('{"prompt": "", "completion": "c"}', "line 1: empty prompt"),
        ('{"prompt": "p", "completion": null}', "line 1: completion must be a string, found NoneType"),
        ('{"messages": "hi"}', "line 1: messages must be a non-empty list"),
        ('{"messages": []}', "line 1: messages must be a non-empty list"),
        ('{"messages": [{"role": "user"}]}', "line 1: message 1 is not a {\"role\", \"content\"} object"),
        ('{"messages": [{"role": "tool", "content": "x"}]}',
         "message 1 has role 'tool'; use system, user or assistant"),
        ('{"messages": [{"role": "user", "content": ["x"]}]}', "message 1 content must be a string, found list"),
        ('{"messages": [{"role": "user", "content": "x"}]}', "line 1: no assistant turn, so nothing to train on"),
        ('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": " "}]}',
         "line 1: message 2 is an empty assistant turn"),
    ]
    for i, (text, needle) in enumerate(cases):
        path = tmp_path / f"bad{i}.jsonl"
        path.write_text(text)
        one_line_error(lambda: read(path), f"train data '{path}' line", needle)
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps([{"text": "a"}, {"text": ""}]))
    one_line_error(lambda: read(listed), f"'{listed}' row 2: empty text")
    broken = tmp_path / "broken.json"
    broken.write_text('[{"text": "a"},\n{"text": }]')
    one_line_error(lambda: read(broken), "line 2: invalid JSON", "one JSON list of objects")


def test_missing_datasets_names_the_extra(tmp_path, monkeypatch):
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` now raises ImportError
    one_line_error(lambda: read(tmp_path / "d.parquet"), "pip install 'corecpu[datasets]'")
