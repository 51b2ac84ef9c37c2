"""Baseline for benchmarks/throughput.py: Hugging Face `Trainer` on CPU, DDP under torchrun or one process.

    torchrun --standalone --nproc-per-node 2 benchmarks/hf_trainer.py --data FILE --out-json run.json
    python benchmarks/hf_trainer.py --batch-size 32 --out-json run.json      # one process, all cores

Trainer's defaults except what the comparison fixes: use_cpu, ddp_backend="gloo",
bf16 per --precision, the per-device batch, epochs (or max_steps), corecpu's lr,
weight decay, clipping and linear schedule with the same number of warm-up steps,
train_sampling_strategy "group_by_length" with --group-by-length (else "random"),
DataCollatorWithPadding (dynamic padding), evaluation after every epoch (and after
the last step), no logging, no saving, dataloader_num_workers 0. Needs accelerate.

Model, initialisation and data are corecpu's (same seed, same loaders). Rank 0
records a wall-clock time in `on_step_end` (after optimizer.step and zero_grad);
every rank keeps its per-step loss, batch size and padded length, summed over
ranks after training. Accuracy and F1 use corecpu's own formulas.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
from transformers import DataCollatorWithPadding, EvalPrediction, Trainer, TrainerCallback, TrainingArguments

from common import load_train_eval, parse_baseline_args, tokenize, total_steps, write_records  # benchmarks/ on sys.path
from corecpu.tasks.classification import eval_counts, scores_from_counts
from corecpu.training.modeling import load_model, load_tokenizer


def parse_args() -> argparse.Namespace:
    return parse_baseline_args(__doc__.split("\n")[0], "per device (per_device_train_batch_size)")


class Recorder(TrainerCallback):
    """Wall-clock time at the end of every optimizer step; the metrics of every evaluation."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.evals: list[dict[str, Any]] = []

    def on_step_end(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        self.times.append(time.perf_counter())

    def on_evaluate(self, args: TrainingArguments, state: Any, control: Any, metrics: dict[str, float] | None = None,
                    **kwargs: Any) -> None:
        self.evals.append({"step": state.global_step, **(metrics or {})})


class RecordingTrainer(Trainer):
    """Trainer that also keeps each step's loss, batch size and padded length (CPU tensors: no extra syncs)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.step_losses: list[float] = []
        self.step_sizes: list[int] = []
        self.step_widths: list[int] = []

    def training_step(self, model: torch.nn.Module, inputs: dict[str, Any],
                      num_items_in_batch: Any = None) -> torch.Tensor:
        size, width = inputs["input_ids"].shape
        loss = super().training_step(model, inputs, num_items_in_batch)
        # With average_tokens_across_devices (the default) and a model whose forward takes
        # **kwargs, compute_loss multiplies the loss by the number of processes, expecting the
        # model to have divided by the global item count. BERT's classification head ignores
        # num_items_in_batch (plain mean), so undo the factor to report the true mean loss.
        if (self.args.average_tokens_across_devices and self.model_accepts_loss_kwargs
                and num_items_in_batch is not None):
            loss = loss / self.accelerator.num_processes
        self.step_losses.append(loss.item())
        self.step_sizes.append(size)
        self.step_widths.append(width)
        return loss


def step_records(trainer: RecordingTrainer, recorder: Recorder, world: int) -> list[dict[str, Any]] | None:
    """Rank 0: one record per optimizer step (its end time, mean loss, global samples, mean padded
    width) in benchmarks/stats.py's format; None on the other ranks. Collective."""
    n = len(recorder.times)
    # Per-rank losses are means over each rank's batch: average over ranks; sizes and widths add up.
    per_step = torch.tensor([trainer.step_losses[:n], trainer.step_sizes[:n], trainer.step_widths[:n]],
                            dtype=torch.float64)
    if world > 1:
        dist.all_reduce(per_step)
    if (dist.get_rank() if dist.is_initialized() else 0) != 0:
        return None
    return [{"step": i + 1, "t": recorder.times[i], "loss": per_step[0, i].item() / world,
             "samples": int(per_step[1, i]), "padded_len": per_step[2, i].item() / world} for i in range(n)]


def metrics_fn(num_labels: int):
    def compute_metrics(pred: EvalPrediction) -> dict[str, float]:
        logits = torch.as_tensor(pred.predictions[0] if isinstance(pred.predictions, tuple) else pred.predictions)
        labels = torch.as_tensor(pred.label_ids)
        scores = scores_from_counts(eval_counts(logits.float(), labels, torch.ones(len(labels)), num_labels),
                                    num_labels)
        # Trainer's own eval_loss carries the same x num_processes factor as the training loss
        # (see training_step); the cross-entropy of the logits is the loss every variant reports.
        return {"accuracy": scores["eval_accuracy"], "f1": scores["eval_f1"], "examples": scores["eval_examples"],
                "xent": scores["eval_loss"]}
    return compute_metrics


def main() -> None:
    args = parse_args()
    train, evald = load_train_eval(args)
    tokenizer = load_tokenizer(args.model)
    train_items = tokenize(train, tokenizer, args.max_seq_len)
    eval_items = tokenize(evald, tokenizer, args.max_seq_len)
    model, _ = load_model(args.model, train.label_names, args.seed)

    world = int(os.environ.get("WORLD_SIZE", "1"))
    steps = total_steps(len(train_items), args.batch_size * world, args.epochs, args.max_steps)
    workdir = tempfile.mkdtemp(prefix="hf-trainer-bench-")  # output_dir is required; nothing is written
    training_args = TrainingArguments(
        output_dir=workdir,
        use_cpu=True,
        ddp_backend="gloo" if world > 1 else None,
        bf16=args.precision == "bf16",
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size,
        num_train_epochs=args.epochs,
        max_steps=steps if args.max_steps else -1,
        learning_rate=args.lr,
        weight_decay=args.weight_decay,
        max_grad_norm=args.max_grad_norm,
        # corecpu warms up int(ratio * steps) steps; a float warmup_steps would round up instead.
        warmup_steps=int(args.warmup_ratio * steps),
        seed=args.seed,
        train_sampling_strategy="group_by_length" if args.group_by_length else "random",
        eval_strategy="epoch",
        logging_strategy="no",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    recorder = Recorder()
    trainer = RecordingTrainer(model=model, args=training_args, train_dataset=train_items, eval_dataset=eval_items,
                               processing_class=tokenizer, data_collator=DataCollatorWithPadding(tokenizer),
                               compute_metrics=metrics_fn(len(train.label_names)), callbacks=[recorder])
    trainer.train()
    if not recorder.evals or recorder.evals[-1]["step"] != trainer.state.global_step:
        trainer.evaluate()  # max_steps ended mid-epoch: evaluate the final weights like corecpu does
    shutil.rmtree(workdir, ignore_errors=True)

    records = step_records(trainer, recorder, world)
    if records is not None:
        n = len(records)
        evals = [{"step": e["step"], **{k: v for k, v in e.items() if k.startswith("eval_")},
                  "eval_loss": e.get("eval_xent"), "trainer_eval_loss": e.get("eval_loss")} for e in recorder.evals]
        write_records(args.out_json, "hf_trainer", records, evals, world_size=world,
                      omp_num_threads=os.environ.get("OMP_NUM_THREADS"), torch_threads=torch.get_num_threads(),
                      optim=str(training_args.optim), precision=args.precision,
                      sampling=training_args.train_sampling_strategy)
        final = records[-1]["loss"]
        print(f"hf_trainer: {n} steps, final loss {final:.4f}" + ("" if math.isfinite(final) else " (NOT FINITE)")
              + f", eval accuracy {evals[-1].get('eval_accuracy', float('nan')):.4f}")


if __name__ == "__main__":
    main()
