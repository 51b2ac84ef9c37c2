"""Sequence classification (MRPC-style pairs, sentiment, any labelled text): the default task.

What varies from task to task lives here: how examples become features (tokenized once per
host, length-grouped), the model class (AutoModelForSequenceClassification), what one
evaluation computes (loss, accuracy, F1 from counts summed over ranks), and the model card.
The loop in train.py is the same for every task.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch
from torch.utils.data import DataLoader

from corecpu import envvars
from corecpu.data.columns import Column
from corecpu.data.files import FORMAT_CHOICES
from corecpu.data.sources import auto_eval_data, load_data
from corecpu.data.tokencache import tokenize_cached
from corecpu.data.tokenized import META_KEYS, TokenizedDataset, make_collate
from corecpu.data.types import ClassificationData
from corecpu.errors import CoreCPUError
from corecpu.reporting.model_card import write_model_card
from corecpu.training.train_config import TaskOptions, TrainConfig
from corecpu.training.modeling import load_model
from corecpu.training.run_options import opt
from corecpu.training.run import Run


@dataclass(frozen=True)
class ClassificationOptions(TaskOptions):
    """`cfg.task_options` of --task classification: how to read the columns of a data file."""

    summary = "sequence classification, e.g. MRPC"
    default_data = "builtin"
    default_max_seq_len = 128
    eval_metrics = ("eval_loss", "eval_accuracy", "eval_f1")

    data_format: str = opt("auto", "format of --data/--eval-data files; auto: from the extension",
                           choices=FORMAT_CHOICES)
    header: bool = opt(True, "TSV/CSV files start with a header line (--no-header: pick columns by index)")
    text_column: str = opt("", "column (name or 0-based index) holding the text; inferred when empty", metavar="COL",
                           defines_run=True)
    text_pair_column: str = opt("", "column holding the second sentence of a pair, if any", metavar="COL",
                                defines_run=True)
    label_column: str = opt("", "column holding the label; inferred when empty", metavar="COL", defines_run=True)


@dataclass
class TaskData:
    train: ClassificationData
    eval: ClassificationData | None

    @property
    def notes(self) -> list[str]:
        return self.train.notes + (self.eval.notes if self.eval else [])


class Classification:
    """--task classification; the contract it keeps is corecpu.tasks.contract.Task."""

    name = "classification"
    Options = ClassificationOptions
    loss_items = None  # a mean per example: micro-batches count alike

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.options: ClassificationOptions = cfg.task_options  # type: ignore[assignment]  (make_task checks it)

    def load(self) -> TaskData:
        """The training examples and, unless --eval-data is none, the held-out ones (same label ids)."""
        cfg = self.cfg
        if cfg.data == "qa" or cfg.eval_data == "qa":
            raise CoreCPUError("'qa' is the built-in question-answering set; pass --task qa to train on it")
        opts = self.options
        columns: dict[str, Any] = {k: _column(getattr(opts, k))
                                   for k in ("text_column", "text_pair_column", "label_column")}
        columns.update(fmt=None if opts.data_format == "auto" else opts.data_format, has_header=opts.header)
        train = load_data(cfg.data, split="train", **columns)
        spec = cfg.eval_data if cfg.eval_data != "auto" else auto_eval_data(cfg.data)
        held = None if spec == "none" else load_data(spec, split="eval", label_names=train.label_names, **columns)
        return TaskData(train, held)

    def model(self, data: TaskData) -> tuple[torch.nn.Module, str]:
        return load_model(self.cfg.model, data.train.label_names, self.cfg.seed)

    def checkpoint_config(self, data: TaskData) -> dict[str, Any]:
        """Compared on resume: a checkpoint trained on other labels does not fit this head."""
        return {"label_names": data.train.label_names}

    def describe(self, data: TaskData) -> str:
        return (f"{len(data.train)} train / {len(data.eval) if data.eval else 0} eval examples, labels "
                f"{data.train.label_names}")

    def features(self, data: TaskData, tokenizer: Any, run: Run) -> tuple[TokenizedDataset, TokenizedDataset | None]:
        """Tokenized once per host: local rank 0 tokenizes (or reads its cache), the others load its file."""
        cfg = self.cfg
        cache = envvars.cache_dir() / "tokenized"
        train = tokenize_cached(data.train, tokenizer, cfg.max_seq_len, cache, run.local_rank, kind="training")
        held = (tokenize_cached(data.eval, tokenizer, cfg.max_seq_len, cache, run.local_rank, kind="eval")
                if data.eval else None)
        return train, held

    def collate(self, tokenizer: Any):  # noqa: ANN201 - a collate function
        return make_collate(tokenizer, self.cfg.pad_to_multiple_of, self.cfg.max_seq_len)

    def evaluate(self, run: Run, model: torch.nn.Module, loader: DataLoader) -> dict[str, float]:
        """Loss, accuracy and F1 over the whole eval set: every rank its shard, counts summed over ranks."""
        num_labels = len(loader.dataset.label_names)
        counts = torch.zeros(3 + 3 * num_labels, dtype=torch.float64)
        with run.evaluating(model):  # the reduction too: a rank that stops before it is named as in evaluation
            for batch in loader:
                weights = {k: batch.pop(k) for k in META_KEYS}["valid"]
                logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
                counts += eval_counts(logits, batch["labels"], weights, num_labels)
            total = torch.tensor(run.all_reduce_sum(counts.tolist()), dtype=torch.float64)
        return scores_from_counts(total, num_labels)

    @staticmethod
    def eval_line(step: int, scores: Mapping[str, float]) -> str:
        return (f"eval  step {step} | loss {scores['eval_loss']:.4f} | accuracy {scores['eval_accuracy']:.4f} | "
                f"F1 {scores['eval_f1']:.4f} | {scores['eval_examples']} examples")

    def model_card(self, final: Path, config: Mapping[str, Any], summary: Mapping[str, Any],
                   data: TaskData) -> None:
        write_model_card(final, config, summary, data.train.label_names, data.train.source)


def _column(value: str) -> Column:
    """A --*-column value: empty means infer, digits mean a 0-based index, anything else a header name."""
    return None if value == "" else int(value) if value.isdigit() else value


# ---------------------------------------------------------------- scores from counts
# Computed from counts (loss sum, examples, per-class TP/FP/FN) so that summing the counts over
# ranks and then computing gives exactly the score of the whole set, however it was sharded.

def eval_counts(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor, num_labels: int) -> torch.Tensor:
    """[loss_sum, n, correct, tp_0..tp_k, fp_0..fp_k, fn_0..fn_k] for one batch; weight 0 marks padding."""
    w = weights.to(torch.float64)
    loss = torch.nn.functional.cross_entropy(logits.float(), labels, reduction="none").to(torch.float64)
    pred = logits.argmax(dim=-1)
    hit = (pred == labels).to(torch.float64)
    pred_1h = torch.nn.functional.one_hot(pred, num_labels).to(torch.float64) * w[:, None]
    true_1h = torch.nn.functional.one_hot(labels, num_labels).to(torch.float64) * w[:, None]
    tp = (pred_1h * true_1h).sum(0)
    fp = pred_1h.sum(0) - tp
    fn = true_1h.sum(0) - tp
    head = torch.stack([(loss * w).sum(), w.sum(), (hit * w).sum()])
    return torch.cat([head, tp, fp, fn])


def scores_from_counts(counts: torch.Tensor, num_labels: int) -> dict[str, float]:
    """Loss, accuracy and F1: binary F1 of label 1 for two classes, macro F1 otherwise."""
    loss_sum, n, correct = counts[:3].tolist()
    tp, fp, fn = counts[3:].view(3, num_labels)
    denom = 2 * tp + fp + fn
    f1 = torch.where(denom > 0, 2 * tp / denom.clamp(min=1e-12), torch.zeros_like(tp))
    f1_value = f1[1].item() if num_labels == 2 else f1.mean().item()
    n = max(n, 1.0)
    return {"eval_loss": loss_sum / n, "eval_accuracy": correct / n, "eval_f1": f1_value, "eval_examples": int(n)}
