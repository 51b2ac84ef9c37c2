"""Tier 1: the QA task's pieces that run without processes: configuration, the feature cache's
round trip, items and batches, gathering logits in feature order, score keys."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from corecpu.data.builtin_qa import builtin_qa_dataset
from corecpu.data.qa import QAExample
from corecpu.errors import CoreCPUError
from corecpu.tasks.qa import (
    QAFeatureDataset,
    QAOptions,
    examples_fingerprint,
    features_from_state,
    features_state,
    in_feature_order,
    score_keys,
)
from corecpu.tasks.qa_features import eval_features, select, train_features
from corecpu.tasks.registry import make_task, parse_config
from corecpu.training.modeling import load_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("default")


@pytest.fixture(scope="module")
def examples():
    return builtin_qa_dataset("eval", n=12).examples


# ---------------------------------------------------------------- configuration

def test_task_defaults_follow_the_task():
    qa = parse_config(["--task", "qa"])
    opts = qa.task_options
    assert isinstance(opts, QAOptions)
    assert (qa.data, qa.max_seq_len) == ("qa", 384)
    assert (opts.doc_stride, opts.n_best_size, opts.max_answer_length) == (128, 20, 30)
    plain = parse_config([])
    assert (plain.task, plain.data, plain.max_seq_len) == ("classification", "builtin", 128)
    assert parse_config(["--task", "qa", "--max-seq-len", "256", "--doc-stride", "64"]).max_seq_len == 256


@pytest.mark.parametrize("argv, fragment", [
    (["--task", "classification", "--doc-stride", "64"], "--doc-stride applies to --task qa, not to --task "
     "classification; drop it or pass the other --task"),
    (["--doc-stride", "128"], "--doc-stride applies to --task qa"),  # given is given, even at qa's default
    (["--version-2-with-negative"], "--version-2-with-negative applies to --task qa"),
    (["--task", "qa", "--label-column", "y"], "--label-column applies to --task classification"),
    (["--task", "qa", "--no-header"], "--header applies to --task classification"),
    (["--task", "qa", "--doc-stride", "384"], "--doc-stride 384 must be below --max-seq-len 384"),
    (["--task", "qa", "--n-best-size", "0"], "--n-best-size must be at least 1"),
    (["--task", "qa", "--null-score-diff-threshold", "nan"], "must be a finite number"),
    (["--task", "ner"], "invalid choice: 'ner'"),
])
def test_bad_task_flags_are_one_line_errors(argv, fragment):
    with pytest.raises(CoreCPUError, match=fragment.replace("-", r"\-").replace("(", r"\(")):
        parse_config(argv)


def test_data_sets_of_the_other_task_are_refused():
    with pytest.raises(CoreCPUError, match="'qa' is the built-in question-answering set; pass --task qa"):
        make_task(parse_config(["--data", "qa"])).load()
    with pytest.raises(CoreCPUError, match="--data paraphrase is a built-in classification set; for --task qa"):
        make_task(parse_config(["--task", "qa", "--data", "paraphrase"])).load()


def test_builtin_qa_loads_both_splits_and_v2_adds_unanswerable_questions():
    data = make_task(parse_config(["--task", "qa"])).load()
    assert len(data.train) == 2000 and len(data.eval) == 400 and not data.notes
    assert not any(ex.is_impossible for ex in data.train.examples)
    v2 = make_task(parse_config(["--task", "qa", "--version-2-with-negative", "--eval-data", "none"])).load()
    assert v2.eval is None and 0.05 < sum(ex.is_impossible for ex in v2.train.examples) / len(v2.train) < 0.15


# ---------------------------------------------------------------- features, cache, items

def test_feature_cache_round_trip_is_exact(tok, examples):
    for build in (train_features, eval_features):
        feats = build(examples, tok, 128, 32)  # short windows: several per context
        assert len(feats) > len(examples)
        back = features_from_state(features_state(feats))
        assert back == feats


def test_fingerprint_changes_with_any_answer_detail(examples):
    base = examples_fingerprint(examples)
    moved = [QAExample(e.id, e.question, e.context, e.answer_texts, tuple(s + 1 for s in e.answer_starts))
             if i == 3 else e for i, e in enumerate(examples)]
    assert examples_fingerprint(moved) != base
    assert examples_fingerprint(list(examples)) == base


def test_items_and_batches_carry_what_the_model_and_eval_need(tok, examples):
    train = QAFeatureDataset(train_features(examples, tok, 128, 32))
    item = train[0]
    assert set(item) == {"input_ids", "valid", "token_type_ids", "start_positions", "end_positions"}
    collate = make_task(parse_config(["--task", "qa"])).collate(tok)
    batch = collate([train[i] for i in range(4)])
    assert batch["start_positions"].dtype == torch.long and batch["start_positions"].shape == (4,)
    held = QAFeatureDataset(eval_features(examples, tok, 128, 32), examples)
    batch = collate([held[(5, False)], held[(2, True)]])
    assert batch["feature_index"].tolist() == [5, 2] and batch["valid"].tolist() == [False, True]
    assert "start_positions" not in batch


def test_select_keeps_rows_in_the_order_asked(tok, examples):
    feats = eval_features(examples, tok, 128, 32)
    part = select(feats, [3, 0])
    assert part.input_ids == [feats.input_ids[3], feats.input_ids[0]]
    assert part.example_ids == [feats.example_ids[3], feats.example_ids[0]]
    assert part.offsets == [feats.offsets[3], feats.offsets[0]] and part.start_positions is None


# ---------------------------------------------------------------- gathering and scores

def _part(indices):
    return [(i, np.full(3, float(i)), np.full(3, -float(i))) for i in indices]


def test_logits_come_back_in_feature_order_from_strided_ranks():
    starts, ends = in_feature_order([_part([0, 2, 4]), _part([1, 3])], 5)
    assert [s[0] for s in starts] == [0, 1, 2, 3, 4] and [e[0] for e in ends] == [0, -1, -2, -3, -4]


@pytest.mark.parametrize("parts, fragment", [
    ([_part([0, 2]), _part([1])], "lost 1 of 4 windows \\(first: \\[3\\]\\)"),
    ([_part([0, 2]), _part([1, 3, 0])], "window 0 twice"),
    ([_part([0, 1, 2, 3, 7])], "window 7 of 4"),
])
def test_a_lost_or_repeated_window_fails_loudly(parts, fragment):
    with pytest.raises(CoreCPUError, match=fragment):
        in_feature_order(parts, 4)


def test_score_keys_name_v1_and_v2_alike():
    assert score_keys({"exact_match": 50.0, "f1": 60.0}, 4) == {"eval_exact_match": 50.0, "eval_f1": 60.0,
                                                                 "eval_examples": 4}
    v2 = score_keys({"exact": 40.0, "f1": 45.0, "total": 5, "HasAns_exact": 30.0, "HasAns_f1": 37.5,
                     "HasAns_total": 4, "NoAns_exact": 100.0, "NoAns_f1": 100.0, "NoAns_total": 1}, 5)
    assert v2["eval_exact_match"] == 40.0 and v2["eval_HasAns_exact_match"] == 30.0
    assert v2["eval_NoAns_total"] == 1 and isinstance(v2["eval_NoAns_total"], int) and "eval_total" not in v2
    line = make_task(parse_config(["--task", "qa"])).eval_line(7, v2)
    assert line == ("eval  step 7 | exact match 40.00 | F1 45.00 | 5 questions | HasAns EM 30.00 F1 37.50 (4) | "
                    "NoAns EM 100.00 F1 100.00 (1)")


def test_flat_rows_from_jsonl_and_a_saved_dataset_dict(tmp_path):
    import json

    datasets = pytest.importorskip("datasets")
    rows = {split: [{"id": ex.id, "question": ex.question, "context": ex.context,
                     "answers": {"text": list(ex.answer_texts), "answer_start": list(ex.answer_starts)}}
                    for ex in builtin_qa_dataset(split, n=n).examples] for split, n in (("train", 30), ("eval", 8))}
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("".join(json.dumps({**r, "query": r.pop("question")}) + "\n" for r in
                             [dict(r) for r in rows["train"]]))
    data = make_task(parse_config(["--task", "qa", "--data", str(jsonl), "--question-column", "query"])).load()
    assert len(data.train) == 30 and data.eval is None  # a file: no evaluation unless --eval-data
    saved = tmp_path / "squad"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows["train"]),
                          "validation": datasets.Dataset.from_list(rows["eval"])}).save_to_disk(str(saved))
    data = make_task(parse_config(["--task", "qa", "--data", str(saved)])).load()
    assert (len(data.train), len(data.eval)) == (30, 8)  # --eval-data auto: the saved validation split
    assert [ex.id for ex in data.eval.examples] == [r["id"] for r in rows["eval"]]
