"""SQuAD's official exact match and F1, v1.1 and v2.0, so corecpu's numbers compare with published ones.

Both official scripts normalise answers the same way (lower case, no punctuation, no articles
a/an/the, single spaces) and take the best score over a question's gold answers. They differ:

  v1.1  every gold answer counts; F1 of two empty answers is 0; a question without a
        prediction scores 0 and stays in the total.
  v2.0  gold answers that normalise to empty are dropped and an unanswerable question's gold
        is [""]; F1 is 1 when prediction and gold are both empty, 0 when only one is; a question
        without a prediction is left out of the total (so a run that loses predictions can
        score higher); HasAns_* / NoAns_* split the scores by whether the data gave answers.

corecpu scores with missing="strict": a missing prediction is an error naming the ids, never a
silent change of the total. missing="official" reproduces the scripts.
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from corecpu import atomic
from corecpu.errors import CoreCPUError

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)
MISSING = ("strict", "official")


def normalize_answer(text: str) -> str:
    """The official normalisation, in the official order (punctuation goes before articles)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str, *, version_2: bool = False) -> float:
    """Token-overlap F1 of the normalised answers."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if version_2 and (not pred or not ref):
        return float(pred == ref)  # v2.0: "no answer" is right only against "no answer"
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def score_question(prediction: str, golds: Sequence[str], *, version_2: bool = False) -> tuple[float, float]:
    """(exact match, F1) of one prediction: the best over the gold answers."""
    if version_2:
        golds = [g for g in golds if normalize_answer(g)] or [""]
    elif not golds:
        raise CoreCPUError("a question without gold answers cannot be scored with SQuAD v1.1; score unanswerable "
                           "questions with v2.0 semantics (--version-2-with-negative)")
    return (max(exact_match(prediction, g) for g in golds),
            max(f1(prediction, g, version_2=version_2) for g in golds))


def _ids(ids: Sequence[str], limit: int = 5) -> str:
    return ", ".join(repr(i) for i in ids[:limit]) + (f", ... ({len(ids)} in all)" if len(ids) > limit else "")


def squad_scores(gold: Mapping[str, Sequence[str]], predictions: Mapping[str, str], *, version_2: bool = False,
                 missing: str = "strict") -> dict[str, float]:
    """Scores in percent with the official keys: v1.1 {exact_match, f1}; v2.0 {exact, f1, total,
    HasAns_exact, HasAns_f1, HasAns_total, NoAns_exact, NoAns_f1, NoAns_total} (a group only
    when the data has such questions).

    `gold` maps question id -> gold answer texts ([] for unanswerable; corecpu.data.qa.gold_answers).
    missing="strict" raises on a question without a prediction and on a prediction for an
    unknown id; "official" ignores unknown ids and scores a missing prediction as its version does.
    """
    if missing not in MISSING:
        raise CoreCPUError(f"unknown missing-prediction mode {missing!r}; use 'strict' or 'official'")
    if not gold:
        raise CoreCPUError("no gold answers to score against; pass the eval questions' answers")
    absent = [qid for qid in gold if qid not in predictions]
    if missing == "strict":
        if absent:
            raise CoreCPUError(f"{len(absent)} of {len(gold)} questions have no prediction ({_ids(absent)}); "
                               "predict every eval question (a lost prediction would change the total)")
        unknown = [qid for qid in predictions if qid not in gold]
        if unknown:
            raise CoreCPUError(f"{len(unknown)} predictions are for question ids not in the gold answers "
                               f"({_ids(unknown)}); score predictions against the data they were made for")
    scored = {qid: score_question(predictions[qid], golds, version_2=version_2)
              for qid, golds in gold.items() if qid in predictions}
    if not version_2:
        total = len(gold)  # v1.1: a missing prediction is a 0 in the total
        return {"exact_match": 100.0 * sum(em for em, _ in scored.values()) / total,
                "f1": 100.0 * sum(f for _, f in scored.values()) / total}
    if not scored:
        raise CoreCPUError("no question has a prediction; predict the eval questions before scoring")

    def group(ids: list[str]) -> dict[str, float]:
        return {"exact": 100.0 * sum(scored[q][0] for q in ids) / len(ids),
                "f1": 100.0 * sum(scored[q][1] for q in ids) / len(ids), "total": len(ids)}

    # v2.0 drops missing predictions from every total; the official script then fails with a
    # KeyError in its HasAns/NoAns split, which here covers the scored questions of each group.
    out = group(list(scored))
    has_answer = [q for q in scored if gold[q]]  # as the script: answers given, even if they normalise away
    no_answer = [q for q in scored if not gold[q]]
    for prefix, ids in (("HasAns", has_answer), ("NoAns", no_answer)):
        if ids:
            out.update({f"{prefix}_{k}": v for k, v in group(ids).items()})
    return out


def _write_json(path: Path, obj: object) -> None:
    atomic.write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")  # readers never see half a file


def write_predictions(directory: str | Path, predictions: Mapping[str, str],
                      null_odds: Mapping[str, float] | None = None, *, prefix: str = "") -> list[Path]:
    """predictions.json ({id: text}) and, when given, null_odds.json ({id: null - best span score}),
    the two files the official v2.0 script takes; returns the paths written."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CoreCPUError(f"cannot write predictions to '{directory}': not a directory; create it first")
    written = [directory / f"{prefix}predictions.json"]
    _write_json(written[0], dict(predictions))
    if null_odds is not None:
        written.append(directory / f"{prefix}null_odds.json")
        _write_json(written[1], {k: float(v) for k, v in null_odds.items()})
    return written
