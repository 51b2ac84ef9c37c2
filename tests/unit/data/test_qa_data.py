"""Tier 1: QA examples from SQuAD JSON, JSONL and Hugging Face datasets (corecpu.data.qa), and the
generated QA set (corecpu.data.builtin_qa)."""

from __future__ import annotations

import json
import re

import pytest

from corecpu.data.builtin_qa import builtin_qa_dataset
from corecpu.data.qa import (
    QAExample,
    gold_answers,
    load_qa,
    load_qa_hf,
    load_qa_jsonl,
    load_squad_json,
    write_squad_json,
)
from helpers.one_line import one_line_error

CONTEXT = "Paris is the capital of France. Lyon is its third city."
EXAMPLES = [
    QAExample("q1", "What is the capital of France?", CONTEXT, ("Paris",), (0,)),
    QAExample("q2", "Which is the third city?", CONTEXT, ("Lyon", "Lyon"), (32, 32)),
    QAExample("q3", "Where is the Louvre?", "The Louvre is in Paris.", ("Paris",), (17,)),
]
IMPOSSIBLE = QAExample("q4", "What is the capital of Spain?", CONTEXT)


def squad_doc(qas: list[dict], context: str = CONTEXT, version: str = "1.1") -> dict:
    return {"version": version, "data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}


def qa(qid: str = "q7", text: str = "Paris", start: int = 0, **extra) -> dict:
    return {"id": qid, "question": "What is the capital?", "answers": [{"text": text, "answer_start": start}], **extra}


def write_json(path, doc) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


def flat_rows(examples) -> list[dict]:
    return [{"id": e.id, "question": e.question, "context": e.context,
             "answers": {"text": list(e.answer_texts), "answer_start": list(e.answer_starts)}} for e in examples]


# ---------------------------------------------------------------- round trips and loaders

def test_squad_json_round_trip_v1_and_v2(tmp_path):
    assert write_squad_json(tmp_path / "v1.json", EXAMPLES) == 3
    doc = json.loads((tmp_path / "v1.json").read_text())
    assert doc["version"] == "1.1" and len(doc["data"][0]["paragraphs"]) == 2  # q1, q2 share a paragraph
    assert "is_impossible" not in doc["data"][0]["paragraphs"][0]["qas"][0]
    data = load_squad_json(tmp_path / "v1.json")
    assert data.examples == EXAMPLES and data.source == str(tmp_path / "v1.json")

    write_squad_json(tmp_path / "v2.json", EXAMPLES + [IMPOSSIBLE])
    assert json.loads((tmp_path / "v2.json").read_text())["version"] == "2.0"
    v2 = load_squad_json(tmp_path / "v2.json", allow_impossible=True)
    assert v2.examples == EXAMPLES + [IMPOSSIBLE] and v2.examples[-1].is_impossible
    assert gold_answers(v2.examples) == {"q1": ["Paris"], "q2": ["Lyon", "Lyon"], "q3": ["Paris"], "q4": []}
    one_line_error(lambda: write_squad_json(tmp_path / "x.json", [IMPOSSIBLE], version="1.1"), "write version 2.0")


def test_official_v2_layout_with_plausible_answers(tmp_path):
    doc = squad_doc([qa("a"), {"id": "b", "question": "Capital of Spain?", "answers": [], "is_impossible": True,
                               "plausible_answers": [{"text": "Lyon", "answer_start": 32}]}], version="v2.0")
    path = write_json(tmp_path / "dev-v2.0.json", doc)
    data = load_qa(path, allow_impossible=True)
    assert [e.is_impossible for e in data.examples] == [False, True] and data.examples[1].answer_texts == ()


def test_jsonl_default_and_custom_columns(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in flat_rows(EXAMPLES)) + "\n\n")
    assert load_qa(str(path)).examples == EXAMPLES
    renamed = [{"qid": 7, "q": r["question"], "passage": r["context"],
                "spans": [{"text": t, "answer_start": s} for t, s in zip(r["answers"]["text"],
                                                                           r["answers"]["answer_start"])]}
               for r in flat_rows(EXAMPLES[:1])]
    path.write_text(json.dumps(renamed[0]) + "\n")
    data = load_qa_jsonl(path, id_column="qid", question_column="q", context_column="passage",
                         answers_column="spans")
    assert data.examples == [QAExample("7", EXAMPLES[0].question, CONTEXT, ("Paris",), (0,))]


def test_hugging_face_parquet_and_save_to_disk(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = flat_rows(EXAMPLES + [IMPOSSIBLE])
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "train.parquet"))
    assert load_qa(tmp_path / "train.parquet", allow_impossible=True).examples == EXAMPLES + [IMPOSSIBLE]
    one_line_error(lambda: load_qa_hf(tmp_path / "train.parquet"), "'q4'", "--version-2-with-negative")
    dd = datasets.DatasetDict(train=datasets.Dataset.from_list(rows[:2]), validation=datasets.Dataset.from_list(rows[2:3]))
    dd.save_to_disk(str(tmp_path / "squad"))
    held = load_qa(tmp_path / "squad", split="eval")
    assert held.examples == EXAMPLES[2:3] and held.source.endswith(":eval")
    one_line_error(lambda: load_qa_hf(tmp_path / "squad", split="train", answers_column="spans"),
                   "no column 'spans'", "--answers-column")


# ---------------------------------------------------------------- errors: one line, naming the fix

def test_answer_offset_must_point_at_the_text(tmp_path):
    path = write_json(tmp_path / "x.json", squad_doc([qa(start=32)]))
    msg = one_line_error(lambda: load_squad_json(path), f"data file '{path}' question id 'q7'",
                         "answer_start 32 does not point at the answer text 'Paris'", "'Lyon ' there",
                         "the text occurs at offset 0", "fix the offset or the text")
    assert msg.startswith("data file")
    # A context with a newline at the wrong offset still gives one line (repr escapes it).
    path = write_json(tmp_path / "nl.json", squad_doc([qa(text="Paris", start=1)], context="P\naris Paris"))
    one_line_error(lambda: load_squad_json(path), r"'\naris'")
    path = write_json(tmp_path / "far.json", squad_doc([qa(start=len(CONTEXT) - 2)]))
    one_line_error(lambda: load_squad_json(path), "runs outside the context", "fix the offset")
    path = write_json(tmp_path / "neg.json", squad_doc([qa(start=-1)]))
    one_line_error(lambda: load_squad_json(path), "runs outside the context")
    path = write_json(tmp_path / "str.json", squad_doc([qa(start="0")]))
    one_line_error(lambda: load_squad_json(path), "answer_start must be an integer")


@pytest.mark.parametrize("doc, needles", [
    (squad_doc([qa(), qa()]), ("question id 'q7' appears more than once", "unique id")),
    (squad_doc([qa()], context="  "), ("empty context", "fix or drop")),
    (squad_doc([dict(qa(), question=" ")]), ("empty question",)),
    (squad_doc([{"id": "q7", "question": "Why?"}]), ("missing 'answers'", "SQuAD JSON is")),
    ({"version": "1.1", "data": [{"title": "t", "paragraphs": [{"qas": []}]}]}, ("missing 'context'",)),
    ({"version": "1.1"}, ("missing 'data'",)),
    (squad_doc([qa(text=" ")]), ("empty answer text",)),
    (squad_doc([qa(is_impossible=True)]), ("is_impossible is true but the question has answers (1)",
                                           "plausible_answers")),
    (squad_doc([dict(qa(), answers=[])]), ("question id 'q7': the question has no answer",
                                           "pass --version-2-with-negative")),
    (squad_doc([]), ("has no questions",)),
])
def test_squad_json_errors(tmp_path, doc, needles):
    path = write_json(tmp_path / "x.json", doc)
    one_line_error(lambda: load_squad_json(path), *needles)


def test_unanswerable_needs_the_flag_in_every_format(tmp_path):
    path = write_json(tmp_path / "x.json", squad_doc([dict(qa(), answers=[], is_impossible=True)], version="v2.0"))
    assert load_squad_json(path, allow_impossible=True).examples[0].is_impossible
    jsonl = tmp_path / "x.jsonl"
    jsonl.write_text(json.dumps(flat_rows([IMPOSSIBLE])[0]) + "\n")
    one_line_error(lambda: load_qa(jsonl), f"data file '{jsonl}' line 1 question id 'q4'", "--version-2-with-negative")
    assert load_qa(jsonl, allow_impossible=True).examples == [IMPOSSIBLE]


def test_file_level_errors(tmp_path):
    jsonl = tmp_path / "x.jsonl"
    jsonl.write_text(json.dumps(flat_rows(EXAMPLES[:1])[0]) + "\n{broken\n")
    one_line_error(lambda: load_qa(jsonl), "line 2: invalid JSON", "one JSON object")
    jsonl.write_text(json.dumps({"id": "a", "question": "q", "context": "c"}) + "\n")
    one_line_error(lambda: load_qa(jsonl), "line 1: missing 'answers'", "--answers-column")
    jsonl.write_text(json.dumps(dict(flat_rows(EXAMPLES[:1])[0], answers="Paris")) + "\n")
    one_line_error(lambda: load_qa(jsonl), "answers must look like")
    jsonl.write_text(json.dumps(dict(flat_rows(EXAMPLES[:1])[0], answers={"text": ["a", "b"], "answer_start": [0]}))
                     + "\n")
    one_line_error(lambda: load_qa(jsonl), "answers need as many texts as answer_starts")
    lines = tmp_path / "lines.json"
    lines.write_text(jsonl.read_text() * 2)
    one_line_error(lambda: load_qa(lines), "invalid JSON", "must be named .jsonl")
    one_line_error(lambda: load_qa(tmp_path / "nope.json"), "not found")
    (tmp_path / "x.txt").write_text("hi")
    one_line_error(lambda: load_qa(tmp_path / "x.txt"), "cannot tell the format")
    one_line_error(lambda: load_qa(tmp_path / "x.json", id_column="qid"), "do not apply to the SQuAD JSON file")


# ---------------------------------------------------------------- the generated set

@pytest.fixture(scope="module")
def generated():
    return {split: builtin_qa_dataset(split) for split in ("train", "eval")}


def test_generated_set_is_deterministic_and_its_splits_disjoint(generated, tmp_path):
    train, held = generated["train"], generated["eval"]
    assert (len(train), len(held)) == (2000, 400)
    assert builtin_qa_dataset("eval").examples == held.examples
    assert builtin_qa_dataset("eval", seed=1).examples != held.examples
    assert builtin_qa_dataset("train", n=50).examples == train.examples[:50]
    assert not {e.context for e in train.examples} & {e.context for e in held.examples}
    assert len({e.id for e in train.examples}) == 2000 and not any(e.is_impossible for e in train.examples)
    # Every answer is where it says: the strict loader accepts the whole set.
    write_squad_json(tmp_path / "train.json", train.examples)
    assert load_squad_json(tmp_path / "train.json").examples == train.examples
    one_line_error(lambda: builtin_qa_dataset("dev"), "use 'train' or 'eval'")


def test_generated_v2_set_has_about_ten_percent_unanswerable():
    data = builtin_qa_dataset("train", with_impossible=True)
    share = sum(e.is_impossible for e in data.examples) / len(data)
    assert 0.07 < share < 0.13 and "v2" in data.source
    # Both kinds: a fact the context gives others but not this person, and a person not in the context.
    named = [re.search(r"[A-Z][a-z]+ [A-Z][a-z]+", e.question).group() in e.context
             for e in data.examples if e.is_impossible]
    assert 0 < sum(named) < len(named)


def test_generated_lengths_need_doc_stride(generated):
    from corecpu.training.modeling import load_tokenizer

    tok = load_tokenizer("default")
    examples = generated["train"].examples
    contexts = list(dict.fromkeys(e.context for e in examples))
    lengths = [len(ids) for ids in tok(contexts)["input_ids"]]
    assert 150 < sum(lengths) / len(lengths) < 230  # SQuAD-like: most contexts fit one 384-token window
    assert 0.02 < sum(n > 384 for n in lengths) / len(lengths) < 0.12  # some need a second window
    answer_tokens = [len(ids) for ids in tok([e.answer_texts[0] for e in examples], add_special_tokens=False)["input_ids"]]
    assert min(answer_tokens) >= 1 and max(answer_tokens) <= 10


def test_generated_questions_need_more_than_word_overlap(generated):
    """The sentence sharing most words with the question holds the answer for few questions:
    distractor sentences name the person asked about, the person's own facts often a pronoun."""
    hits = 0
    examples = generated["eval"].examples
    for e in examples:
        sentences = [m.span() for m in re.finditer(r"[^.]+\.", e.context)]
        words = set(re.findall(r"\w+", e.question.lower()))
        lo, hi = max(sentences, key=lambda s: len(words & set(re.findall(r"\w+", e.context[s[0]:s[1]].lower()))))
        hits += lo <= e.answer_starts[0] < hi
    assert hits / len(examples) < 0.65
