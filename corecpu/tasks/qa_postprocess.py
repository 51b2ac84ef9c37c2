"""From start/end logits per window to one answer text per question, as run_qa.py's utils_qa does it.

For each example, over all of its windows: the `n_best_size` highest start and end logits
propose spans; a span counts when both ends are context tokens, start <= end and it is at most
`max_answer_length` tokens long; the best has the highest start + end logit. For SQuAD v2.0
(`allow_impossible`), the null score is the CLS token's start + end logit, the lowest over the
example's windows (every window must agree there is no answer), and the prediction is ""
when null score - best span score > `null_score_diff_threshold`.

null_odds holds that real difference for every question (run_qa.py passes a constant 0.0 to
the metric instead); it is what a threshold search or SQuAD v2's na_prob file wants.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from corecpu.data.qa import QAExample
from corecpu.errors import CoreCPUError
from corecpu.tasks.qa_features import QAFeatures, is_context


@dataclass(frozen=True)
class QAPredictions:
    predictions: dict[str, str]  # question id -> answer text ("" = no answer)
    null_odds: dict[str, float]  # question id -> null score - best span score


def _numpy(logits: Any) -> np.ndarray:
    """One window's logits as float64 numpy, from numpy, a list or a torch tensor (bf16 included)."""
    if hasattr(logits, "detach"):  # torch, without importing it: numpy cannot take bf16 or grad tensors
        logits = logits.detach().float().cpu().numpy()
    return np.asarray(logits, dtype=np.float64)


def _best_span(start: np.ndarray, end: np.ndarray, offsets: Sequence[Any], n_best: int,
               max_answer_length: int) -> tuple[float, int, int] | None:
    """(score, start char, end char) of the best allowed span in one window, or None."""
    n = min(len(offsets), len(start), len(end))  # logits may be padded past the window's tokens
    if n == 0:
        return None
    context = np.array([is_context(o) for o in offsets[:n]])
    char_start = np.array([o[0] if is_context(o) else 0 for o in offsets[:n]])
    char_end = np.array([o[1] if is_context(o) else 0 for o in offsets[:n]])
    k = min(n_best, n)
    starts = np.argsort(-start[:n], kind="stable")[:k]
    ends = np.argsort(-end[:n], kind="stable")[:k]
    s, e = starts[:, None], ends[None, :]
    ok = context[s] & context[e] & (e >= s) & (e - s + 1 <= max_answer_length) & (char_start[s] < char_end[e])
    if not ok.any():
        return None
    scores = np.where(ok, start[s] + end[e], -np.inf)
    i, j = np.unravel_index(int(np.argmax(scores)), scores.shape)
    return float(scores[i, j]), int(char_start[starts[i]]), int(char_end[ends[j]])


def postprocess(examples: Sequence[QAExample], features: QAFeatures, start_logits: Sequence[Any],
                end_logits: Sequence[Any], *, allow_impossible: bool = False, n_best_size: int = 20,
                max_answer_length: int = 30, null_score_diff_threshold: float = 0.0) -> QAPredictions:
    """Answer texts for `examples` from the logits of their eval `features`, in feature order.

    start_logits[i] / end_logits[i] belong to feature i, position j to its token j (a 2-D
    array padded on the right, or one array per feature). Every example must have at least
    one feature with logits: a missing one means the eval loop lost data, never a blank answer.
    """
    if n_best_size < 1 or max_answer_length < 1:
        raise CoreCPUError(f"n_best_size {n_best_size} and max_answer_length {max_answer_length} must both be at "
                           "least 1; the usual values are 20 and 30")
    if features.offsets is None:
        raise ValueError("postprocess needs eval features (with offsets); build them with eval_features")
    if not len(start_logits) == len(end_logits) == len(features):
        raise ValueError(f"got {len(start_logits)} start and {len(end_logits)} end logit rows for {len(features)} "
                         "features; gather the logits of every feature, in feature order")
    windows: dict[str, list[int]] = {ex.id: [] for ex in examples}
    for i, qid in enumerate(features.example_ids):
        if qid not in windows:
            raise ValueError(f"feature {i} belongs to question id {qid!r}, which is not among the examples; "
                             "pass the examples the features were built from")
        windows[qid].append(i)
    lost = [qid for qid, idx in windows.items() if not idx]
    if lost:
        raise ValueError(f"{len(lost)} questions have no feature (first: {lost[:5]}); build the features from "
                         "these same examples")
    predictions: dict[str, str] = {}
    null_odds: dict[str, float] = {}
    for ex in examples:
        best: tuple[float, int, int] | None = None
        null = np.inf
        for i in windows[ex.id]:
            start, end = _numpy(start_logits[i]), _numpy(end_logits[i])
            if start.size == 0 or end.size == 0:
                raise ValueError(f"feature {i} (question id {ex.id!r}) has no logits; gather every feature's logits")
            cls = features.cls_index[i]
            null = min(null, float(start[cls] + end[cls]))
            span = _best_span(start, end, features.offsets[i], n_best_size, max_answer_length)
            if span is None:  # no allowed span among the n best: look at all of them (rare)
                span = _best_span(start, end, features.offsets[i], len(start), max_answer_length)
            if span is not None and (best is None or span[0] > best[0]):
                best = span
        if best is None:
            raise ValueError(f"question id {ex.id!r}: no window has a context token within max_answer_length; "
                             "check that the features came from eval_features")
        score, lo, hi = best
        null_odds[ex.id] = null - score
        predictions[ex.id] = "" if allow_impossible and null - score > null_score_diff_threshold else ex.context[lo:hi]
    return QAPredictions(predictions, null_odds)
