"""Variant (c) of benchmarks/throughput.py: Hugging Face `Trainer` on CPU with DDP.

    torchrun --standalone --nproc-per-node 2 benchmarks/hf_trainer.py --steps 60 --out-json run.json

Trainer's defaults except what the comparison fixes: use_cpu, ddp_backend="gloo",
bf16 per --precision, the same per-device batch size, max_steps, lr 1e-4 with
weight decay 0.01 and 10% linear warm-up (corecpu's defaults; Trainer already
clips at 1.0 and decays linearly), DataCollatorWithPadding (dynamic padding),
no eval, no logging, no saving, dataloader_num_workers 0. Needs accelerate.

Model, initialisation and data are corecpu's (same seed). Rank 0 records a
wall-clock time in `on_step_end` (after optimizer.step and zero_grad); every rank
keeps its per-step loss and batch size, summed over ranks after training.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
from transformers import DataCollatorWithPadding, Trainer, TrainerCallback, TrainingArguments

from common import parse_baseline_args  # benchmarks/ is on sys.path when run as a script
from corecpu.tasks import builtin_dataset
from corecpu.modeling import load_model, load_tokenizer


def parse_args() -> argparse.Namespace:
    return parse_baseline_args(__doc__.split("\n")[0], "per rank (per_device_train_batch_size)")


class StepClock(TrainerCallback):
    """Wall-clock time at the end of every optimizer step."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def on_step_end(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        self.times.append(time.perf_counter())


class RecordingTrainer(Trainer):
    """Trainer that also keeps each step's loss and batch size (no extra syncs: CPU tensors)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.step_losses: list[float] = []
        self.step_sizes: list[int] = []

    def training_step(self, model: torch.nn.Module, inputs: dict[str, Any],
                      num_items_in_batch: Any = None) -> torch.Tensor:
        size = inputs["labels"].shape[0]
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
        return loss


def main() -> None:
    args = parse_args()
    data = builtin_dataset("train")
    tokenizer = load_tokenizer(args.model)
    enc = tokenizer(data.texts, truncation=True, max_length=args.max_seq_len)
    items = [{**{k: enc[k][i] for k in enc}, "labels": data.labels[i]} for i in range(len(data))]
    model, _ = load_model(args.model, data.label_names, args.seed)

    workdir = tempfile.mkdtemp(prefix="hf-trainer-bench-")  # output_dir is required; nothing is written
    training_args = TrainingArguments(
        output_dir=workdir,
        use_cpu=True,
        ddp_backend="gloo",
        bf16=args.precision == "bf16",
        per_device_train_batch_size=args.batch_size,
        max_steps=args.steps,
        learning_rate=args.lr,
        weight_decay=0.01,
        warmup_steps=0.1,  # a float below 1 is a ratio of max_steps
        seed=args.seed,
        eval_strategy="no",
        logging_strategy="no",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    clock = StepClock()
    trainer = RecordingTrainer(model=model, args=training_args, train_dataset=items,
                               data_collator=DataCollatorWithPadding(tokenizer), callbacks=[clock])
    trainer.train()
    shutil.rmtree(workdir, ignore_errors=True)

    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    n = len(clock.times)
    # step_losses holds each rank's mean loss on its own batch; average them over ranks.
    stats = torch.tensor([trainer.step_losses[:n], trainer.step_sizes[:n]], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(stats)
    if rank == 0:
        records = [{"step": i + 1, "t": clock.times[i], "loss": stats[0, i].item() / world,
                    "samples": int(stats[1, i])} for i in range(n)]
        args.out_json.parent.mkdir(parents=True, exist_ok=True)
        args.out_json.write_text(json.dumps({"variant": "hf_trainer", "world_size": world,
                                             "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                                             "torch_threads": torch.get_num_threads(),
                                             "optim": str(training_args.optim),
                                             "steps": records}))
        final = records[-1]["loss"]
        print(f"hf_trainer: {n} steps, final loss {final:.4f}" + ("" if math.isfinite(final) else " (NOT FINITE)"))


if __name__ == "__main__":
    main()
