"""Tier 1: QA windows and answer labels with the real all-MiniLM-L6-v2 fast tokenizer
(corecpu.tasks.qa_features)."""

from __future__ import annotations

import pytest

from corecpu.data.qa import QAExample
from corecpu.errors import CoreCPUError
from corecpu.tasks.qa_features import (
    check_fast_tokenizer,
    eval_features,
    feature_lengths,
    is_context,
    train_features,
)
from corecpu.training.modeling import load_tokenizer, resolve_model_dir

FILLER = " ".join(f"Town number {i} has a harbour and a bakery." for i in range(60))  # ~600 tokens
ANSWER = "Ingrid Varga"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("default")


def long_example(at: int, qid: str = "long") -> QAExample:
    """A context of about 650 tokens with the answer after `at` characters of filler."""
    cut = FILLER.rfind(" ", 0, at) + 1
    context = f"{FILLER[:cut]}The mayor is {ANSWER}. {FILLER[cut:]}"
    start = context.index(ANSWER)
    return QAExample(qid, "  Who is the mayor?", context, (ANSWER,), (start,))


def context_span(feats, i):
    """(first, last) context token of window i, from its eval offsets."""
    idx = [k for k, o in enumerate(feats.offsets[i]) if is_context(o)]
    return idx[0], idx[-1]


def test_windows_overlap_by_stride_and_label_the_answer_where_it_is_whole(tok):
    ex = long_example(1400)  # about token 300: inside windows 0 and 1
    train = train_features([ex], tok, max_length=384, stride=128)
    held = eval_features([ex], tok, max_length=384, stride=128)
    assert len(train) == len(held) >= 2 and set(train.example_ids) == {"long"}
    assert max(feature_lengths(train)) == 384 and feature_lengths(train) == [len(x) for x in held.input_ids]
    answer_chars = (ex.answer_starts[0], ex.answer_starts[0] + len(ANSWER))
    labelled = 0
    for i in range(len(train)):
        assert train.input_ids[i] == held.input_ids[i]
        first, last = context_span(held, i)
        if i:  # the next window starts `stride` tokens before the previous one ended
            prev_last = context_span(held, i - 1)[1]
            assert held.offsets[i][first] == held.offsets[i - 1][prev_last - 127]
        whole = held.offsets[i][first][0] <= answer_chars[0] and held.offsets[i][last][1] >= answer_chars[1]
        s, e = train.start_positions[i], train.end_positions[i]
        if whole:
            labelled += 1
            assert tok.decode(train.input_ids[i][s:e + 1]) == ANSWER.lower()
            assert (held.offsets[i][s][0], held.offsets[i][e][1]) == answer_chars
        else:
            assert s == e == train.cls_index[i] == 0 and train.input_ids[i][0] == tok.cls_token_id
    assert labelled == 2


def test_an_answer_cut_by_a_window_edge_points_at_cls_there(tok):
    held = eval_features([long_example(100)], tok, max_length=128, stride=32)
    last = context_span(held, 0)[1]
    # Put the answer across the end of window 0: its first word is window 0's last token.
    ctx = held.offsets[0]
    base = long_example(100).context
    split_at = ctx[last][0]
    context = base[:split_at] + ANSWER + " " + base[split_at:]
    ex = QAExample("edge", "Who is the mayor?", context, (ANSWER,), (split_at,))
    feats = train_features([ex], tok, max_length=128, stride=32)
    labels = list(zip(feats.start_positions, feats.end_positions))
    assert labels[0] == (0, 0)  # "ingrid" fits, "varga" does not
    assert any(s > 0 for s, _ in labels[1:])


def test_answer_at_the_last_context_token_is_not_labelled_sep(tok):
    """run_qa.py's scan runs past the window's last context token into [SEP] and labels it."""
    base = long_example(100)
    held = eval_features([base], tok, max_length=128, stride=32)
    last = context_span(held, 0)[1]
    lo, hi = held.offsets[0][last]
    word = base.context[lo:hi]
    ex = QAExample("last", base.question, base.context, (word,), (lo,))  # same question: same windows
    feats = train_features([ex], tok, max_length=128, stride=32)
    assert (feats.start_positions[0], feats.end_positions[0]) == (last, last)
    assert feats.input_ids[0][last + 1] == tok.sep_token_id


def test_eval_offsets_are_none_outside_the_context(tok):
    ex = QAExample("q", "Where is the Louvre?", "The Louvre is in Paris.", ("Paris",), (17,))
    held = eval_features([ex], tok)
    ids, offsets = held.input_ids[0], held.offsets[0]
    sep = ids.index(tok.sep_token_id)
    assert all(o is None for o in offsets[:sep + 1]) and offsets[-1] is None  # [CLS] question [SEP] ... [SEP]
    assert [ex.context[a:b] for a, b in offsets[sep + 1:-1]] == ["The", "Louvre", "is", "in", "Paris", "."]
    assert held.start_positions is None and held.example_ids == ["q"] and held.token_type_ids is not None
    assert not is_context(None) and not is_context([]) and is_context((0, 3)) and is_context([0, 3])


def test_unanswerable_and_spaced_answers(tok):
    context = "The Louvre is in  Paris ."
    spaced = QAExample("s", "Where?", context, ("  Paris ",), (15,))  # spaces around the answer text
    none = QAExample("n", "Where is the Prado?", context)
    feats = train_features([spaced, none], tok)
    s, e = feats.start_positions[0], feats.end_positions[0]
    assert tok.decode(feats.input_ids[0][s:e + 1]) == "paris"
    assert (feats.start_positions[1], feats.end_positions[1]) == (0, 0)


def test_left_padding_tokenizers_get_the_context_first(tok):
    left = load_tokenizer("default")
    left.padding_side = "left"
    ex = long_example(1400)
    feats = train_features([ex], left, max_length=384, stride=128)
    first_sep = feats.input_ids[0].index(left.sep_token_id)
    assert tok.decode(feats.input_ids[0][first_sep + 1:]).startswith("who is the mayor")
    spans = [(s, e) for s, e in zip(feats.start_positions, feats.end_positions) if s]
    assert spans and all(tok.decode(feats.input_ids[i][s:e + 1]) == ANSWER.lower()
                         for i, (s, e) in enumerate(zip(feats.start_positions, feats.end_positions)) if s)
    held = eval_features([ex], left, max_length=384, stride=128)
    assert is_context(held.offsets[0][1]) and held.offsets[0][first_sep + 1] is None


def test_a_slow_tokenizer_is_refused(tok):
    # ProphetNet's tokenizer is pure-Python WordPiece: the same vocabulary, no offsets.
    from transformers import ProphetNetTokenizer

    model_dir = resolve_model_dir("default")
    slow = ProphetNetTokenizer(vocab_file=str(model_dir / "vocab.txt"))
    slow.name_or_path = str(model_dir)
    assert not slow.is_fast
    for call in (check_fast_tokenizer, lambda t: train_features([long_example(10)], t)):
        with pytest.raises(CoreCPUError) as info:
            call(slow)
        msg = str(info.value)
        assert "\n" not in msg and str(model_dir) in msg and "fast tokenizer" in msg and "tokenizer.json" in msg


def test_question_too_long_for_the_stride_is_a_one_line_error(tok):
    long_q = QAExample("wordy", "why " * 300, FILLER, ("Town",), (0,))
    with pytest.raises(CoreCPUError) as info:  # the tokenizer would abort with a Rust panic instead
        eval_features([long_example(10), long_q], tok, max_length=384, stride=128)
    msg = str(info.value)
    assert "\n" not in msg and "question id 'wordy' has 300 tokens" in msg and "doc stride below 81" in msg
    with pytest.raises(CoreCPUError, match="more than the model takes"):
        eval_features([long_example(10)], tok, max_length=1024)
    with pytest.raises(CoreCPUError, match="no QA examples"):
        train_features([], tok)
