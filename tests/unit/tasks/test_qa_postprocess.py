"""Tier 1: from start/end logits to answer texts (corecpu.tasks.qa_postprocess)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from corecpu.data.qa import QAExample
from corecpu.errors import CoreCPUError
from corecpu.tasks.qa_features import QAFeatures, eval_features
from corecpu.tasks.qa_postprocess import postprocess
from corecpu.training.modeling import load_tokenizer

CONTEXT = "Ada Varga was born in Karnholm in 1971 and moved to Velmora in 1999 ."
WORDS = [(m, m + len(w)) for m, w in zip([0, 4, 10, 14, 19, 22, 31, 34, 39, 43, 49, 52, 60, 63, 68],
                                            CONTEXT.split())]
assert [CONTEXT[a:b] for a, b in WORDS] == CONTEXT.split()
EX = QAExample("q", "When did she move?", CONTEXT, ("1999",), (63,))


def window(words: list[tuple[int, int]], question_pad=(None, [], None)) -> list:
    """[CLS] q q [SEP] <context words> [SEP] as offsets: question tokens as None or [] (datasets style)."""
    return [None, *question_pad, *words, None]


def logits(n: int, peaks: dict[int, float]) -> np.ndarray:
    out = np.zeros(n)
    for i, v in peaks.items():
        out[i] = v
    return out


def features(*windows: list, ids: tuple[str, ...] = ("q", "q")) -> QAFeatures:
    return QAFeatures([[0] * len(w) for w in windows], None, list(ids[:len(windows)]), [0] * len(windows),
                      offsets=list(windows))


def test_best_span_across_two_windows():
    w0, w1 = window(WORDS[:9]), window(WORDS[6:])  # windows overlap on "1971 and moved"
    feats = features(w0, w1)
    # Window 0 likes "Karnholm" (score 5 + 5), window 1 likes "1999" (6 + 6): the best of all wins.
    starts = [logits(len(w0), {9: 5.0}), logits(len(w1), {11: 6.0})]
    ends = [logits(len(w0), {9: 5.0}), logits(len(w1), {11: 6.0})]
    out = postprocess([EX], feats, starts, ends)
    assert out.predictions == {"q": "1999"} and out.null_odds["q"] == pytest.approx(0 - 12.0)
    # A 2-D padded array in feature order works the same; so do torch tensors, bf16 included.
    padded = np.zeros((2, 16))
    padded[0, :len(w0)], padded[1, :len(w1)] = starts
    assert postprocess([EX], feats, padded, padded).predictions == {"q": "1999"}
    as_torch = torch.tensor(padded, dtype=torch.bfloat16, requires_grad=True)
    assert postprocess([EX], feats, as_torch, as_torch).predictions == {"q": "1999"}


def test_spans_must_be_in_context_ordered_and_short_enough():
    w = window(WORDS)
    feats = features(w)
    n = len(w)
    # The highest logits sit on [CLS], a None and a [] question token: never part of an answer.
    # Context word j is token 4 + j: 4 "Ada", 9 "Karnholm", 11 "1971".
    start = logits(n, {0: 50.0, 1: 40.0, 2: 40.0, 4: 3.0, 9: 2.0})
    end = logits(n, {0: 50.0, 2: 40.0, 3: 40.0, 11: 3.0, 9: 2.5, 4: 0.1})
    out = postprocess([EX], feats, [start], [end])
    assert out.predictions["q"] == "Ada Varga was born in Karnholm in 1971"  # tokens 4..11, score 6
    assert postprocess([EX], feats, [start], [end], max_answer_length=5).predictions["q"] == "Karnholm in 1971"
    assert postprocess([EX], feats, [start], [end], max_answer_length=1).predictions["q"] == "Karnholm"
    # End before start is never a span: "and" (12) to "Varga" (5) would score 18.
    start2, end2 = logits(n, {12: 9.0, 5: 2.0}), logits(n, {5: 9.0, 13: 1.0})
    assert postprocess([EX], feats, [start2], [end2]).predictions["q"] == "Varga"
    # n_best_size=1 keeps only [CLS] as start and end: all spans are then searched instead of none.
    assert postprocess([EX], feats, [start], [end], n_best_size=1).predictions["q"] == out.predictions["q"]


def test_null_answer_threshold_and_min_null_score_over_windows():
    w0, w1 = window(WORDS[:9]), window(WORDS[6:])
    feats = features(w0, w1)
    starts = [logits(len(w0), {0: 4.0, 9: 1.0}), logits(len(w1), {0: 2.0, 11: 3.0})]
    ends = [logits(len(w0), {0: 4.0, 9: 1.0}), logits(len(w1), {0: 1.0, 11: 2.0})]
    # null = min(8, 3) = 3; best span "1999" = 5; diff -2 <= 0: answer.
    out = postprocess([EX], feats, starts, ends, allow_impossible=True)
    assert out.predictions["q"] == "1999" and out.null_odds["q"] == pytest.approx(-2.0)
    assert postprocess([EX], feats, starts, ends, allow_impossible=True,
                       null_score_diff_threshold=-3.0).predictions["q"] == ""
    # Null well above the best span: "" for v2, still the best span for v1.
    ends[1][0] = 10.0
    assert postprocess([EX], feats, starts, ends, allow_impossible=True).predictions["q"] == ""
    v1 = postprocess([EX], feats, starts, ends)
    assert v1.predictions["q"] == "1999" and v1.null_odds["q"] == pytest.approx(8.0 - 5.0)


def test_no_example_is_ever_dropped():
    other = QAExample("r", "Who?", CONTEXT, ("Ada Varga",), (0,))
    w = window(WORDS)
    with pytest.raises(ValueError, match=r"1 questions have no feature \(first: \['r'\]\)"):
        postprocess([EX, other], features(w), [logits(len(w), {})], [logits(len(w), {})])
    with pytest.raises(ValueError, match="got 1 start and 2 end logit rows for 2 features"):
        postprocess([EX], features(w, w), [np.zeros(len(w))], [np.zeros(len(w))] * 2)
    with pytest.raises(ValueError, match="feature 1 .*has no logits"):
        postprocess([EX], features(w, w), [np.zeros(len(w)), np.zeros(0)], [np.zeros(len(w))] * 2)
    with pytest.raises(ValueError, match="question id 'x', which is not among the examples"):
        postprocess([EX], features(w, ids=("x",)), [np.zeros(len(w))], [np.zeros(len(w))])
    with pytest.raises(CoreCPUError, match="must both be at least 1"):
        postprocess([EX], features(w), [np.zeros(len(w))], [np.zeros(len(w))], max_answer_length=0)


def test_real_windows_from_logits_that_point_at_the_answer():
    """eval_features + postprocess: one-hot logits on the gold tokens of the second window."""
    tok = load_tokenizer("default")
    filler = " ".join(f"Town number {i} has a harbour." for i in range(40))
    context = f"{filler} The mayor is Ingrid Varga. {filler}"
    ex = QAExample("m", "Who is the mayor?", context, ("Ingrid Varga",), (context.index("Ingrid"),))
    feats = eval_features([ex], tok, max_length=128, stride=32)
    gold = (ex.answer_starts[0], ex.answer_starts[0] + len("Ingrid Varga"))
    holder = next(i for i, offs in enumerate(feats.offsets) if any(o and o[0] == gold[0] for o in offs))
    starts = [np.zeros(len(ids)) for ids in feats.input_ids]
    ends = [np.zeros(len(ids)) for ids in feats.input_ids]
    starts[holder][next(k for k, o in enumerate(feats.offsets[holder]) if o and o[0] == gold[0])] = 9.0
    ends[holder][next(k for k, o in enumerate(feats.offsets[holder]) if o and o[1] == gold[1])] = 9.0
    # datasets stores None offsets as []: the result must not change.
    as_stored = QAFeatures(feats.input_ids, feats.token_type_ids, feats.example_ids, feats.cls_index,
                           offsets=[[list(o) if o else [] for o in offs] for offs in feats.offsets])
    for f in (feats, as_stored):
        assert postprocess([ex], f, starts, ends).predictions == {"m": "Ingrid Varga"}
