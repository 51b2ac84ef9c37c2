"""A new task is one module plus one registry line: regression on the built-in sentiment set (the
label as a number, mean squared error), with an option of its own. tests/e2e/test_new_task.py
registers it and runs it through the unchanged train.py; nothing in corecpu knows it."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from corecpu.data.sources import load_data
from corecpu.data.tokenized import META_KEYS, TokenizedDataset, make_collate
from corecpu.training.train_config import TaskOptions
from corecpu.training.modeling import load_model
from corecpu.training.run_options import opt


@dataclass(frozen=True)
class RegressionOptions(TaskOptions):
    summary = "the label as a number, mean squared error"
    scale: float = opt(1.0, "multiply the targets by this")


class Regression:
    name, Options = "regression", RegressionOptions
    loss_items = None  # a mean per example: micro-batches count alike

    def __init__(self, cfg):
        self.cfg, self.options = cfg, cfg.task_options

    def load(self):
        train = load_data(self.cfg.data, split="train")
        return SimpleNamespace(train=train, eval=load_data(self.cfg.data, split="eval"), notes=[])

    def model(self, data):
        return load_model(self.cfg.model, ["score"], self.cfg.seed)  # one output and float labels: MSE loss

    def features(self, data, tokenizer, run):
        return tuple(TokenizedDataset(d, tokenizer, self.cfg.max_seq_len) for d in (data.train, data.eval))

    def collate(self, tokenizer):
        pad = make_collate(tokenizer, self.cfg.pad_to_multiple_of, self.cfg.max_seq_len)

        def collate(items):
            batch = pad(items)
            batch["labels"] = batch["labels"].float() * self.options.scale
            return batch
        return collate

    def checkpoint_config(self, data):
        return {}

    def describe(self, data):
        return f"{len(data.train)} train / {len(data.eval)} eval sentences, the label as a number"

    def evaluate(self, run, model, loader):
        sums = [0.0, 0.0]
        with run.evaluating(model):
            for batch in loader:
                valid, labels = {k: batch.pop(k) for k in META_KEYS}["valid"].double(), batch.pop("labels").double()
                error = model(**batch).logits.squeeze(-1).double() - labels
                sums = [sums[0] + float((error ** 2 * valid).sum()), sums[1] + float(valid.sum())]
            squares, n = run.all_reduce_sum(sums)
        return {"eval_mse": squares / max(n, 1.0), "eval_examples": int(n)}

    def eval_line(self, step, scores):
        return f"eval  step {step} | mse {scores['eval_mse']:.4f} | {scores['eval_examples']} examples"

    def model_card(self, final, config, summary, data):
        (final / "README.md").write_text(f"# Regression\n\nfinal loss {summary['final_loss']}\n")
