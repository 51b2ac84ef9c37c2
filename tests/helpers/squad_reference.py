"""An independent check of corecpu's EM/F1: SQuAD's two official evaluation procedures, restated
here from the published scripts' behaviour (evaluate-v1.1.py, evaluate-v2.0.py without a
na-prob file), reading the same two files they read: the SQuAD JSON and predictions.json.

It shares no code with corecpu.tasks.qa_metrics, so a test comparing the two catches a bug in
either. Both procedures normalise (lower case, drop punctuation, drop a/an/the, collapse
spaces) and take the best score over the gold answers.
"""

from __future__ import annotations

import collections
import json
import re
import string
from pathlib import Path


def _norm(text: str) -> str:
    text = text.lower()
    text = "".join(c for c in text if c not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _f1_v1(pred: str, gold: str) -> float:
    p, g = _norm(pred).split(), _norm(gold).split()
    same = sum((collections.Counter(p) & collections.Counter(g)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def _f1_v2(pred: str, gold: str) -> float:
    p, g = _norm(pred).split(), _norm(gold).split()
    if not p or not g:
        return float(p == g)
    return _f1_v1(pred, gold)


def _questions(squad_json: Path) -> list[dict]:
    articles = json.loads(Path(squad_json).read_text())["data"]
    return [qa for article in articles for paragraph in article["paragraphs"] for qa in paragraph["qas"]]


def score_v1(squad_json: Path, predictions_json: Path) -> dict[str, float]:
    preds = json.loads(Path(predictions_json).read_text())
    qas = _questions(squad_json)
    em = f1 = 0.0
    for qa in qas:
        if qa["id"] not in preds:
            continue  # stays in the total
        golds = [a["text"] for a in qa["answers"]]
        em += max(float(_norm(preds[qa["id"]]) == _norm(g)) for g in golds)
        f1 += max(_f1_v1(preds[qa["id"]], g) for g in golds)
    return {"exact_match": 100 * em / len(qas), "f1": 100 * f1 / len(qas)}


def score_v2(squad_json: Path, predictions_json: Path) -> dict[str, float]:
    preds = json.loads(Path(predictions_json).read_text())
    em: dict[str, float] = {}
    f1: dict[str, float] = {}
    has_answer: dict[str, bool] = {}
    for qa in _questions(squad_json):
        has_answer[qa["id"]] = bool(qa["answers"])
        if qa["id"] not in preds:
            continue  # left out of the total
        golds = [a["text"] for a in qa["answers"] if _norm(a["text"])] or [""]
        em[qa["id"]] = max(float(_norm(preds[qa["id"]]) == _norm(g)) for g in golds)
        f1[qa["id"]] = max(_f1_v2(preds[qa["id"]], g) for g in golds)

    def group(ids: list[str]) -> dict[str, float]:
        return {"exact": 100 * sum(em[i] for i in ids) / len(ids), "f1": 100 * sum(f1[i] for i in ids) / len(ids),
                "total": len(ids)}

    out = group(list(em))
    for name, wanted in (("HasAns", True), ("NoAns", False)):
        ids = [i for i, h in has_answer.items() if h == wanted]
        if ids:
            out.update({f"{name}_{k}": v for k, v in group(ids).items()})
    return out
