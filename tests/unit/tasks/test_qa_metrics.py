"""Tier 1: SQuAD v1.1 / v2.0 exact match and F1 against hand-computed values, including the
official scripts' edge cases (corecpu.tasks.qa_metrics)."""

from __future__ import annotations

import json

import pytest

from corecpu.errors import CoreCPUError
from corecpu.tasks.qa_metrics import (
    exact_match,
    f1,
    normalize_answer,
    score_question,
    squad_scores,
    write_predictions,
)


@pytest.mark.parametrize("text, normal", [
    ("The  Cat!", "cat"),
    ("An apple, a pear and THE plum.", "apple pear and plum"),
    ("theater anthem", "theater anthem"),  # articles only as whole words
    ("the-end", "theend"),  # punctuation goes first, so "the" is no longer a word
    ("  (1,999)  ", "1999"),
    ("a", ""),
])
def test_normalize_answer(text, normal):
    assert normalize_answer(text) == normal


def test_exact_match_and_f1_by_hand():
    assert exact_match("The Eiffel Tower.", "eiffel tower") == 1.0
    assert exact_match("Eiffel", "eiffel tower") == 0.0
    # "big red dog" vs "red dog barked": 2 common tokens, precision 2/3, recall 2/3.
    assert f1("the big red dog", "red dog barked") == pytest.approx(2 / 3)
    # Counts are clipped: "dog dog dog" vs "dog": 1 common, precision 1/3, recall 1 -> 0.5.
    assert f1("dog dog dog", "dog") == pytest.approx(0.5)
    assert f1("cat", "dog") == 0.0
    # The best over the gold answers, separately for EM and F1. "a red dog barked" loses its
    # article: precision 2/2, recall 2/3 -> F1 0.8.
    assert score_question("red dog", ["a red dog barked", "blue cat"]) == (0.0, pytest.approx(0.8))
    assert score_question("red dog", ["a red dog barked", "the red dog"]) == (1.0, 1.0)


def test_empty_answers_differ_between_v1_and_v2():
    # v1.1: empty vs empty is an exact match but F1 0 (no common token); v2.0: both 1.
    assert (exact_match("", ""), f1("", "")) == (1.0, 0.0)
    assert f1("", "", version_2=True) == 1.0
    assert f1("", "Paris", version_2=True) == 0.0 and f1("Paris", "", version_2=True) == 0.0
    assert f1("the", "a", version_2=True) == 1.0  # both normalise to empty
    # v2.0: an unanswerable question's gold is [""]; golds that normalise to empty are dropped.
    assert score_question("", [], version_2=True) == (1.0, 1.0)
    assert score_question("Paris", [], version_2=True) == (0.0, 0.0)
    assert score_question("", ["The", "."], version_2=True) == (1.0, 1.0)
    assert score_question("", ["The", "Paris"], version_2=True) == (0.0, 0.0)  # "Paris" remains
    assert score_question("the", ["The"]) == (1.0, 0.0)  # v1.1 keeps it: EM 1, F1 0
    with pytest.raises(CoreCPUError, match="--version-2-with-negative"):
        score_question("", [])


GOLD = {"a": ["Paris"], "b": ["red dog barked"], "c": [], "d": []}


def test_v2_scores_and_has_no_answer_breakdown():
    preds = {"a": "Paris", "b": "the big red dog", "c": "", "d": "Lyon"}
    s = squad_scores(GOLD, preds, version_2=True)
    assert s == pytest.approx({"exact": 50.0, "f1": 100 * (1 + 2 / 3 + 1 + 0) / 4, "total": 4,
                               "HasAns_exact": 50.0, "HasAns_f1": 100 * (1 + 2 / 3) / 2, "HasAns_total": 2,
                               "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2})
    only_answers = squad_scores({"a": ["Paris"]}, {"a": "paris!"}, version_2=True)
    assert only_answers == {"exact": 100.0, "f1": 100.0, "total": 1, "HasAns_exact": 100.0, "HasAns_f1": 100.0,
                            "HasAns_total": 1}


def test_a_missing_prediction_counts_differently_in_v1_and_v2():
    gold = {"a": ["Paris"], "b": ["Lyon"]}
    preds = {"a": "Paris"}
    v1 = squad_scores(gold, preds, missing="official")
    v2 = squad_scores(gold, preds, version_2=True, missing="official")
    assert v1 == {"exact_match": 50.0, "f1": 50.0}  # a 0 in a total of 2
    assert (v2["exact"], v2["f1"], v2["total"]) == (100.0, 100.0, 1)  # left out of the total
    assert v2["HasAns_total"] == 1  # the official script would raise KeyError here
    for version_2 in (False, True):
        with pytest.raises(CoreCPUError) as info:
            squad_scores(gold, preds, version_2=version_2)
        msg = str(info.value)
        assert "\n" not in msg and "1 of 2 questions have no prediction ('b')" in msg and "predict every" in msg


def test_strict_and_official_with_unknown_ids():
    preds = {"a": "Paris", "b": "x", "c": "", "d": "", "zz": "?"}
    with pytest.raises(CoreCPUError, match=r"1 predictions are for question ids not in the gold answers \('zz'\)"):
        squad_scores(GOLD, preds, version_2=True)
    assert squad_scores(GOLD, preds, version_2=True, missing="official")["total"] == 4  # ignored, as the scripts do
    with pytest.raises(CoreCPUError, match="unknown missing-prediction mode"):
        squad_scores(GOLD, preds, missing="lenient")
    with pytest.raises(CoreCPUError, match="no question has a prediction"):
        squad_scores(GOLD, {}, version_2=True, missing="official")
    many = {str(i): ["x"] for i in range(8)}
    with pytest.raises(CoreCPUError, match=r"'0', '1', '2', '3', '4', \.\.\. \(8 in all\)"):
        squad_scores(many, {})


def test_v1_scores_many_golds():
    gold = {"a": ["Denver Broncos", "The Denver Broncos", "Broncos"], "b": ["1999"]}
    assert squad_scores(gold, {"a": "the Broncos", "b": "in 1999"}) == pytest.approx(
        {"exact_match": 50.0, "f1": 100 * (1 + 2 / 3) / 2})


def test_write_predictions(tmp_path):
    paths = write_predictions(tmp_path, {"a": "Paris", "b": ""}, {"a": -2.5, "b": 1.0})
    assert [p.name for p in paths] == ["predictions.json", "null_odds.json"]
    assert json.loads(paths[0].read_text()) == {"a": "Paris", "b": ""}
    assert json.loads(paths[1].read_text()) == {"a": -2.5, "b": 1.0}
    only = write_predictions(tmp_path, {"a": "Zürich"}, prefix="eval_")
    assert [p.name for p in only] == ["eval_predictions.json"] and "Zürich" in only[0].read_text(encoding="utf-8")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval_predictions.json", "null_odds.json",
                                                          "predictions.json"]  # no temporary files left
    with pytest.raises(CoreCPUError, match="not a directory; create it first"):
        write_predictions(tmp_path / "nope", {})
