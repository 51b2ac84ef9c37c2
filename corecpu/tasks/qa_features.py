"""QA examples as model features: question + context windows, as Hugging Face's run_qa.py makes them.

A context longer than fits beside the question becomes several windows, each overlapping the
last by `stride` tokens, so an answer cut by one window's edge lies whole in the next. Each
window is one feature:

    train_features(examples, tokenizer)  start/end token of the answer in the window, or the
                                         CLS token when the window does not hold all of it
    eval_features(examples, tokenizer)   each token's character span in the context (None
                                         outside it), for qa_postprocess to map logits to text

No padding here (the collate pads per batch), plain lists, no `datasets`. An offset of None
or [] both mean "not context" everywhere: `datasets` stores None as [] (transformers#15401).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from corecpu.data.qa import QAExample
from corecpu.errors import CoreCPUError

Offset = tuple[int, int] | list[int] | None  # a token's [start, end) in the context; None/[] outside it
CHUNK = 1000  # examples per tokenizer call: bounds the memory of encodings with offsets, as run_qa.py's map does


@dataclass
class QAFeatures:
    input_ids: list[list[int]]
    token_type_ids: list[list[int]] | None  # None for models without segment ids
    example_ids: list[str]  # the QAExample.id each window came from; an example may own several
    cls_index: list[int]  # where the "no answer" position is (0 for BERT)
    offsets: list[list[Offset]] | None = None  # eval only
    start_positions: list[int] | None = None  # train only
    end_positions: list[int] | None = None

    def __len__(self) -> int:
        return len(self.input_ids)


def select(features: QAFeatures, rows: Sequence[int]) -> QAFeatures:
    """The features at `rows`, in that order (e.g. the windows of some of the questions)."""
    def pick(values: list[Any] | None) -> list[Any] | None:
        return None if values is None else [values[i] for i in rows]

    return QAFeatures(pick(features.input_ids), pick(features.token_type_ids), pick(features.example_ids),
                      pick(features.cls_index), pick(features.offsets), pick(features.start_positions),
                      pick(features.end_positions))


def is_context(offset: Offset) -> bool:
    """True for a token of the context; None and [] (what datasets makes of None) are not."""
    return bool(offset)


def feature_lengths(features: QAFeatures) -> list[int]:
    """Tokens per feature, for length-grouped batches."""
    return [len(ids) for ids in features.input_ids]


def check_fast_tokenizer(tokenizer: Any) -> None:
    """Offsets and overflowing windows exist only in the Rust ("fast") tokenizers."""
    if not getattr(tokenizer, "is_fast", False):
        where = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise CoreCPUError(f"question answering needs a fast tokenizer, and the one from '{where}' is not; put the "
                           "model's tokenizer.json in its directory (a fast tokenizer can save one with save_pretrained)")


def _check_lengths(examples: Sequence[QAExample], tokenizer: Any, max_length: int, stride: int) -> None:
    """Every question must leave more than `stride` context tokens per window: the tokenizer
    aborts the process (a Rust panic) otherwise, naming no example."""
    limit = getattr(tokenizer, "model_max_length", None)
    if limit is not None and limit < 1_000_000 and max_length > limit:
        raise CoreCPUError(f"max length {max_length} is more than the model takes ({limit} tokens, "
                           f"tokenizer.model_max_length); use a max length of at most {limit}")
    if stride < 0:
        raise CoreCPUError(f"doc stride {stride} is negative; use a stride of 0 or more (128 is usual)")
    specials = tokenizer.num_special_tokens_to_add(pair=True)
    lengths = [len(ids) for ids in tokenizer([ex.question.lstrip() for ex in examples],
                                             add_special_tokens=False)["input_ids"]]
    worst = max(range(len(examples)), key=lengths.__getitem__)
    room = max_length - specials - lengths[worst]
    if room <= stride:
        raise CoreCPUError(f"question id {examples[worst].id!r} has {lengths[worst]} tokens, which leaves {room} "
                           f"context tokens per window at max length {max_length}, no more than the doc stride "
                           f"{stride}; use a doc stride below {max(room, 1)}, a longer max length, or a shorter question")


def _windows(examples: Sequence[QAExample], tokenizer: Any, max_length: int, stride: int) -> Any:
    """Tokenize one chunk: an encoding with one row per window and overflow_to_sample_mapping."""
    questions = [ex.question.lstrip() for ex in examples]  # leading spaces only cost window room
    contexts = [ex.context for ex in examples]
    # Left-padding models (XLNet) take the context first, so their padding never sits inside it.
    right = tokenizer.padding_side == "right"
    return tokenizer(questions if right else contexts, contexts if right else questions,
                     truncation="only_second" if right else "only_first", max_length=max_length, stride=stride,
                     return_overflowing_tokens=True, return_offsets_mapping=True, padding=False)


def _cls_index(input_ids: list[int], tokenizer: Any) -> int:
    for token in (tokenizer.cls_token_id, tokenizer.bos_token_id):
        if token is not None and token in input_ids:
            return input_ids.index(token)
    return 0


def _answer_tokens(offsets: list[Any], context: range, start_char: int, end_char: int) -> tuple[int, int] | None:
    """First and last context token of the answer [start_char, end_char), or None when the
    window does not hold all of it."""
    if offsets[context[0]][0] > start_char or offsets[context[-1]][1] < end_char:
        return None
    # Searching only the context tokens: run_qa.py's scan runs on into [SEP] when the answer
    # starts at a window's last token, and labels [SEP] as the start.
    first = next((k for k in context if offsets[k][1] > start_char), None)
    last = next((k for k in reversed(context) if offsets[k][0] < end_char), None)
    if first is None or last is None or first > last:
        return None  # characters the tokenizer drops entirely (e.g. zero-width): nothing to point at
    return first, last


def _features(examples: Sequence[QAExample], tokenizer: Any, max_length: int, stride: int,
              train: bool) -> QAFeatures:
    check_fast_tokenizer(tokenizer)
    if not examples:
        raise CoreCPUError("no QA examples to tokenize; pass a data set with at least one question")
    _check_lengths(examples, tokenizer, max_length, stride)
    context_id = 1 if tokenizer.padding_side == "right" else 0
    ids_out: list[list[int]] = []
    types: list[list[int]] = []
    example_ids: list[str] = []
    cls_index: list[int] = []
    offsets_out: list[list[Offset]] = []
    starts: list[int] = []
    ends: list[int] = []
    for lo in range(0, len(examples), CHUNK):
        chunk = examples[lo:lo + CHUNK]
        enc = _windows(chunk, tokenizer, max_length, stride)
        for i, (ids, sample) in enumerate(zip(enc["input_ids"], enc["overflow_to_sample_mapping"])):
            ex, offsets, seq = chunk[sample], enc["offset_mapping"][i], enc.sequence_ids(i)
            ids_out.append(ids)
            if "token_type_ids" in enc:
                types.append(enc["token_type_ids"][i])
            example_ids.append(ex.id)
            cls_index.append(_cls_index(ids, tokenizer))
            if not train:
                offsets_out.append([tuple(o) if s == context_id else None for o, s in zip(offsets, seq)])
                continue
            span = None
            if not ex.is_impossible:  # the first answer, as run_qa.py (SQuAD train has one per question)
                text, start = ex.answer_texts[0], ex.answer_starts[0]
                # Bounds without surrounding spaces: no token covers a space, so an answer " Paris"
                # would otherwise never lie "whole" inside a window.
                start_char = start + len(text) - len(text.lstrip())
                end_char = start + len(text.rstrip())
                context = range(seq.index(context_id), len(seq) - seq[::-1].index(context_id))
                span = _answer_tokens(offsets, context, start_char, end_char)
            starts.append(cls_index[-1] if span is None else span[0])
            ends.append(cls_index[-1] if span is None else span[1])
    if train:
        return QAFeatures(ids_out, types or None, example_ids, cls_index, start_positions=starts, end_positions=ends)
    return QAFeatures(ids_out, types or None, example_ids, cls_index, offsets=offsets_out)


def train_features(examples: Sequence[QAExample], tokenizer: Any, max_length: int = 384,
                   stride: int = 128) -> QAFeatures:
    """Windows labelled with the answer's first and last token (the CLS index when absent)."""
    return _features(examples, tokenizer, max_length, stride, train=True)


def eval_features(examples: Sequence[QAExample], tokenizer: Any, max_length: int = 384,
                  stride: int = 128) -> QAFeatures:
    """Windows with example ids and context offsets (None outside the context) for post-processing."""
    return _features(examples, tokenizer, max_length, stride, train=False)
