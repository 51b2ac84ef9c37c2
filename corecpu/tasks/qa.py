"""Extractive question answering (SQuAD v1.1 / v2.0, as Hugging Face's run_qa.py trains it): `--task qa`.

What differs from classification, and nothing else (the loop in train.py is the same):
  data      SQuAD JSON, flat JSONL / Parquet / Arrow / save_to_disk rows, or the built-in 'qa' set
  features  question + context windows (qa_features), tokenized once per host and cached
  model     AutoModelForQuestionAnswering (start and end logits per token)
  eval      every rank runs its shard of the windows; the logits are gathered in feature order
            (padding duplicates dropped, every feature exactly once), every rank post-processes
            a share of the questions (qa_postprocess), and the official EM/F1 (qa_metrics) are
            computed from all predictions; rank 0 writes predictions.json (and null_odds.json
            for v2.0) to --output-dir, the files the official evaluation scripts read.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from corecpu import envvars
from corecpu.data.builtin import TASKS as CLASSIFICATION_SETS
from corecpu.data.builtin_qa import builtin_qa_dataset
from corecpu.data.qa import QAData, QAExample, gold_answers, load_qa
from corecpu.data.tokencache import FORMAT_VERSION, cached_per_host, flat_tensor, tokenizer_fingerprint
from corecpu.data.tokenized import META_KEYS, make_collate
from corecpu.errors import CoreCPUError
from corecpu.reporting.model_card import QA_CARD, write_model_card
from corecpu.tasks.qa_features import QAFeatures, check_fast_tokenizer, eval_features, select, train_features
from corecpu.tasks.qa_metrics import squad_scores, write_predictions
from corecpu.tasks.qa_postprocess import postprocess
from corecpu.training.train_config import TaskOptions, TrainConfig, flag
from corecpu.training.modeling import load_qa_model
from corecpu.training.run_options import opt
from corecpu.training.run import Run

BUILTIN = "qa"  # --data qa: the generated set (corecpu.data.builtin_qa)
COLUMN_NAMES = ("id_column", "question_column", "context_column", "answers_column")


@dataclass(frozen=True)
class QAOptions(TaskOptions):
    """`cfg.task_options` of --task qa: SQuAD's version, the windows, picking the span, flat data's columns."""

    summary = "extractive question answering, SQuAD as run_qa.py trains it"
    default_data = BUILTIN
    eval_metrics = ("eval_exact_match", "eval_f1", "eval_HasAns_exact_match", "eval_HasAns_f1",
                    "eval_NoAns_exact_match", "eval_NoAns_f1")
    default_max_seq_len = 384  # windows of 384 tokens with a 128-token stride, as run_qa.py trains SQuAD

    version_2_with_negative: bool = opt(False, "SQuAD v2.0: questions without an answer are expected (trained to "
                                        "the CLS token, scored as v2.0); without it an empty answer is an error",
                                        defines_run=True)
    doc_stride: int = opt(128, "tokens of overlap between the windows of a context longer than --max-seq-len",
                          defines_run=True)
    n_best_size: int = opt(20, "start and end candidates per window when picking the answer span")
    max_answer_length: int = opt(30, "longest answer span considered, in tokens")
    null_score_diff_threshold: float = opt(0.0, "v2.0: answer \"\" when the no-answer score beats the best span "
                                           "by more than this")
    id_column: str = opt("id", "flat QA data: the column holding the question id", metavar="COL", defines_run=True)
    question_column: str = opt("question", "flat QA data: the column holding the question", metavar="COL",
                               defines_run=True)
    context_column: str = opt("context", "flat QA data: the column holding the context", metavar="COL",
                              defines_run=True)
    answers_column: str = opt("answers", "flat QA data: the column holding {text: [...], answer_start: [...]}",
                              metavar="COL", defines_run=True)

    def validate(self, cfg: TrainConfig) -> None:
        for name in ("n_best_size", "max_answer_length"):
            if getattr(self, name) < 1:
                raise CoreCPUError(f"{flag(name)} must be at least 1, got {getattr(self, name)}")
        if self.doc_stride < 0:
            raise CoreCPUError(f"--doc-stride must not be negative, got {self.doc_stride}")
        if self.doc_stride >= cfg.max_seq_len:
            raise CoreCPUError(f"--doc-stride {self.doc_stride} must be below --max-seq-len {cfg.max_seq_len} "
                               "(windows overlap by the stride); use e.g. --doc-stride 128 with 384")


@dataclass
class QATaskData:
    train: QAData
    eval: QAData | None
    notes: list[str]


class QAFeatureDataset(Dataset):
    """Windows as training items (with start/end positions) or eval items (with their feature index)."""

    def __init__(self, features: QAFeatures, examples: list[QAExample] | None = None) -> None:
        self.features = features
        self.examples = examples  # eval only: the questions the windows answer
        self.train = features.start_positions is not None

    def __len__(self) -> int:
        return len(self.features)

    @property
    def lengths(self) -> list[int]:
        return [len(ids) for ids in self.features.input_ids]

    def __getitem__(self, key: int | tuple[int, bool]) -> dict[str, Any]:
        i, valid = key if isinstance(key, tuple) else (key, True)  # EvalShardSampler marks fillers invalid
        f = self.features
        item: dict[str, Any] = {"input_ids": f.input_ids[i], "valid": valid}
        if f.token_type_ids is not None:
            item["token_type_ids"] = f.token_type_ids[i]
        if self.train:
            item["start_positions"], item["end_positions"] = f.start_positions[i], f.end_positions[i]
        else:
            item["feature_index"] = i
        return item


class QuestionAnswering:
    """--task qa; the contract it keeps is corecpu.tasks.contract.Task."""

    name = "qa"
    Options = QAOptions
    loss_items = None  # a mean per example: micro-batches count alike

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.options: QAOptions = cfg.task_options  # type: ignore[assignment]  (make_task checks it)

    # ------------------------------------------------------------ data and model
    def load(self) -> QATaskData:
        cfg = self.cfg
        train = self._load(cfg.data, "train")
        spec = cfg.eval_data
        if spec == "auto":  # the held-out split of the built-in set or of a saved DatasetDict, else none
            path = Path(cfg.data)
            spec = cfg.data if cfg.data == BUILTIN or (path / "dataset_dict.json").is_file() else "none"
        held = None if spec == "none" else self._load(spec, "eval")
        notes = []
        impossible = sum(ex.is_impossible for ex in train.examples)
        if self.options.version_2_with_negative and not impossible:
            notes.append("--version-2-with-negative is set and no training question is unanswerable; the data "
                         "looks like SQuAD v1.1, so scores follow v2.0's rules without any NoAns questions")
        return QATaskData(train, held, notes)

    def _load(self, spec: str, split: str) -> QAData:
        opts, defaults = self.options, QAOptions.__dataclass_fields__
        if spec == BUILTIN:
            return builtin_qa_dataset(split, seed=0, with_impossible=opts.version_2_with_negative)
        if spec in CLASSIFICATION_SETS:
            raise CoreCPUError(f"--data {spec} is a built-in classification set; for --task qa pass --data {BUILTIN} "
                               "(the built-in QA set), a SQuAD .json or flat QA rows")
        columns = {k: getattr(opts, k) for k in COLUMN_NAMES if getattr(opts, k) != defaults[k].default}
        return load_qa(spec, split=split, allow_impossible=opts.version_2_with_negative, **columns)

    def model(self, data: QATaskData) -> tuple[torch.nn.Module, str]:
        return load_qa_model(self.cfg.model, self.cfg.seed)

    def checkpoint_config(self, data: QATaskData) -> dict[str, Any]:
        return {}  # the settings that shape windows are in cfg.to_dict(), marked defines_run (compared on resume)

    def describe(self, data: QATaskData) -> str:
        held = f"{len(data.eval)} eval questions" if data.eval else "no evaluation"
        v2 = sum(ex.is_impossible for ex in data.train.examples)
        return (f"{len(data.train)} train questions ({data.train.source}{f', {v2} unanswerable' if v2 else ''}) / "
                f"{held}; windows of {self.cfg.max_seq_len} tokens, stride {self.options.doc_stride}")

    def features(self, data: QATaskData, tokenizer: Any,
                 run: Run) -> tuple[QAFeatureDataset, QAFeatureDataset | None]:
        """Windows, built once per host: local rank 0 tokenizes (or reads its cache), the others load its file."""
        check_fast_tokenizer(tokenizer)
        train = QAFeatureDataset(self._cached(data.train.examples, tokenizer, run, train=True))
        held = None
        if data.eval is not None:
            held = QAFeatureDataset(self._cached(data.eval.examples, tokenizer, run, train=False), data.eval.examples)
        return train, held

    def _cached(self, examples: list[QAExample], tokenizer: Any, run: Run, *, train: bool) -> QAFeatures:
        cfg = self.cfg
        build = train_features if train else eval_features
        key = (f"{FORMAT_VERSION}|qa-{'train' if train else 'eval'}|{examples_fingerprint(examples)}|"
               f"{tokenizer_fingerprint(tokenizer)}|{cfg.max_seq_len}|{self.options.doc_stride}")
        path = envvars.cache_dir() / "tokenized" / f"qa-{hashlib.blake2b(key.encode(), digest_size=12).hexdigest()}.pt"
        return cached_per_host(path, lambda: build(examples, tokenizer, cfg.max_seq_len, self.options.doc_stride),
                               features_state, features_from_state, run.local_rank,
                               what=f"{len(examples):,} {'training' if train else 'eval'} questions")

    def collate(self, tokenizer: Any):  # noqa: ANN201 - a collate function
        return make_collate(tokenizer, self.cfg.pad_to_multiple_of, self.cfg.max_seq_len)

    # ------------------------------------------------------------ evaluation
    def evaluate(self, run: Run, model: torch.nn.Module, loader: DataLoader) -> dict[str, float]:
        """EM and F1 over every eval question: each rank its windows, then all logits, then a share of the questions."""
        ds: QAFeatureDataset = loader.dataset  # type: ignore[assignment]
        assert ds.examples is not None, "evaluate() needs the eval dataset from features()"
        cfg, opts = self.cfg, self.options
        with run.evaluating(model):  # the collectives too: a rank that stops there is named as in evaluation
            mine = []
            for batch in loader:
                valid = {k: batch.pop(k) for k in META_KEYS}["valid"]
                index = batch.pop("feature_index")
                out = model(**batch)
                start, end = out.start_logits.float(), out.end_logits.float()
                for row in valid.nonzero().flatten().tolist():
                    tokens = batch["attention_mask"][row].bool()  # the window's own tokens, either padding side
                    mine.append((int(index[row]), start[row][tokens].numpy(), end[row][tokens].numpy()))
            starts, ends = in_feature_order(run.gather(mine), len(ds))
            # Each rank post-processes every world_size-th question; the small answers are then shared.
            share = ds.examples[run.rank::run.world_size]
            wanted = {ex.id for ex in share}
            rows = [i for i, qid in enumerate(ds.features.example_ids) if qid in wanted]
            part = postprocess(share, select(ds.features, rows), [starts[i] for i in rows], [ends[i] for i in rows],
                               allow_impossible=opts.version_2_with_negative, n_best_size=opts.n_best_size,
                               max_answer_length=opts.max_answer_length,
                               null_score_diff_threshold=opts.null_score_diff_threshold) if share else None
            parts = run.gather(None if part is None else (part.predictions, part.null_odds))
        predictions: dict[str, str] = {}
        null_odds: dict[str, float] = {}
        for got in parts:
            if got is not None:
                predictions.update(got[0])
                null_odds.update(got[1])
        order = [ex.id for ex in ds.examples if ex.id in predictions]  # the files list questions as the data does
        predictions = {qid: predictions[qid] for qid in order}
        null_odds = {qid: null_odds[qid] for qid in order}
        scores = squad_scores(gold_answers(ds.examples), predictions, version_2=opts.version_2_with_negative)
        if run.is_main:
            write_predictions(cfg.output_dir, predictions, null_odds if opts.version_2_with_negative else None)
        return score_keys(scores, len(ds.examples))

    def eval_line(self, step: int, scores: Mapping[str, float]) -> str:
        line = (f"eval  step {step} | exact match {scores['eval_exact_match']:.2f} | F1 {scores['eval_f1']:.2f} | "
                f"{scores['eval_examples']} questions")
        for group in ("HasAns", "NoAns"):
            if f"eval_{group}_f1" in scores:
                line += (f" | {group} EM {scores[f'eval_{group}_exact_match']:.2f} F1 {scores[f'eval_{group}_f1']:.2f}"
                         f" ({scores[f'eval_{group}_total']})")
        return line

    def model_card(self, final: Path, config: Mapping[str, Any], summary: Mapping[str, Any],
                   data: QATaskData) -> None:
        write_model_card(final, config, summary, None, data.train.source, kind=QA_CARD)


# ---------------------------------------------------------------- helpers (pure)

def examples_fingerprint(examples: list[QAExample]) -> str:
    """A digest of everything that decides the features: ids, questions, contexts, answers."""
    h = hashlib.blake2b(digest_size=16)
    for ex in examples:
        h.update(json.dumps([ex.id, ex.question, ex.context, ex.answer_texts, ex.answer_starts]).encode())
        h.update(b"\x1e")
    return h.hexdigest()


def in_feature_order(parts: list[list[tuple[int, np.ndarray, np.ndarray]]],
                     num_features: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every rank's (feature index, start logits, end logits), as two lists indexed by feature.

    Each feature must arrive exactly once: a missing one would silently drop a question from
    SQuAD v2.0's total, a repeated one means the sampler's padding was not dropped.
    """
    starts: list[np.ndarray | None] = [None] * num_features
    ends: list[np.ndarray | None] = [None] * num_features
    for part in parts:
        for index, start, end in part:
            if not 0 <= index < num_features:
                raise CoreCPUError(f"evaluation returned logits for window {index} of {num_features}; the eval "
                                   "loader and the eval features disagree")
            if starts[index] is not None:
                raise CoreCPUError(f"evaluation returned window {index} twice; padding duplicates must be dropped "
                                   "(weight by batch['valid'])")
            starts[index], ends[index] = start, end
    lost = [i for i, s in enumerate(starts) if s is None]
    if lost:
        raise CoreCPUError(f"evaluation lost {len(lost)} of {num_features} windows (first: {lost[:5]}); every window "
                           "must be evaluated on some rank")
    return starts, ends  # type: ignore[return-value]


def score_keys(scores: Mapping[str, float], questions: int) -> dict[str, float]:
    """The official keys as metrics: eval_exact_match / eval_f1 for v1.1 and v2.0 alike (v2.0 says
    "exact"), its HasAns_* / NoAns_* groups, and eval_examples = questions scored."""
    out: dict[str, float] = {}
    for key, value in scores.items():
        if key == "total":
            continue
        name = key[:-len("exact")] + "exact_match" if key.endswith("exact") else key
        out[f"eval_{name}"] = int(value) if key.endswith("total") else float(value)
    out["eval_examples"] = questions
    return out


def features_state(features: QAFeatures) -> dict[str, Any]:
    """QAFeatures as tensors and lists that torch.load(weights_only=True) reads back."""
    state: dict[str, Any] = {
        "lengths": torch.tensor([len(r) for r in features.input_ids], dtype=torch.int64),
        "input_ids": flat_tensor(features.input_ids),
        "token_type_ids": None if features.token_type_ids is None else flat_tensor(features.token_type_ids),
        "example_ids": list(features.example_ids), "cls_index": torch.tensor(features.cls_index, dtype=torch.int64),
        "offsets": None, "start_positions": None, "end_positions": None}
    if features.offsets is not None:  # (tokens, 2), -1 for "not context"
        state["offsets"] = torch.tensor([list(o) if o else [-1, -1] for row in features.offsets for o in row],
                                        dtype=torch.int64).reshape(-1, 2)
    if features.start_positions is not None:
        state["start_positions"] = torch.tensor(features.start_positions, dtype=torch.int64)
        state["end_positions"] = torch.tensor(features.end_positions, dtype=torch.int64)
    return state


def features_from_state(state: dict[str, Any]) -> QAFeatures:
    lengths = state["lengths"].tolist()

    def rows(t: torch.Tensor | None) -> list[list[Any]] | None:
        return None if t is None else [r.tolist() for r in t.split(lengths)]

    offsets = None
    if state["offsets"] is not None:
        offsets = [[tuple(o) if o[0] >= 0 else None for o in row] for row in rows(state["offsets"])]
    positions = {k: None if state[k] is None else state[k].tolist() for k in ("start_positions", "end_positions")}
    return QAFeatures(rows(state["input_ids"]), rows(state["token_type_ids"]), list(state["example_ids"]),
                      state["cls_index"].tolist(), offsets=offsets, **positions)
