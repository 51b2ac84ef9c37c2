"""What causal-LM users run instead of corecpu: TRL's SFTTrainer (with peft for LoRA), under torchrun or alone.

    torchrun --standalone --nproc-per-node 2 benchmarks/trl_sft.py --model DIR --data train.jsonl \\
        --eval-data eval.jsonl --form tuned --batch-size 4 --max-steps 40 --out-json run.json
    python benchmarks/trl_sft.py --form plain --order order.json ...      # tests/e2e/test_trl_equivalence.py

The forms (what differs; everything else below is held equal to corecpu's run):
  defaults  SFTConfig's own defaults: bf16 autocast, gradient checkpointing, no packing (each batch padded to
            its longest example), group_by_length off
  tuned     what a careful user sets: packing (TRL's best-fit decreasing into --max-seq-len rows, padding-free),
            no gradient checkpointing, --precision as measured faster on the CPU at hand
  plain     no packing, fp32, no gradient checkpointing, the examples in the order of --order (a JSON list of
            indices) with no shuffling: the same job as a corecpu run, for step-by-step loss comparison

Held equal: the model directory and its weights (fp32), LoRA's settings and initial adapters (torch.manual_seed(seed)
right before peft's get_peft_model, as corecpu.training.lora does), the prompt/completion JSONL and TRL's own
tokenization of it (loss on the completion and the EOS TRL appends), per-device batch, max_steps, AdamW with lr,
weight decay and clipping 1.0, a linear schedule with the same warm-up steps, the seed, gloo, no saving, no trackers,
dataloader_num_workers 0.

Rank 0 writes --out-json: each step's loss (token-weighted over all ranks, as corecpu's), the training seconds
(SFTTrainer's train_runtime), the tokens trained (TRL's own num_tokens count: non-pad input tokens, all ranks),
the eval loss after training (mean next-token loss over the eval file's completion tokens, fp32, computed here the
same way corecpu's eval_loss does, each rank scoring its share of the rows as the Trainer's evaluate() would) and
each rank's peak RSS. The trained model (or adapter) is saved, as a user
saves it (corecpu writes final/ and a last checkpoint), to a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from datasets import Dataset
from torch.utils.data import Sampler
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="a causal LM directory (corecpu's built-in ones live under "
                   "~/.cache/corecpu/models)")
    p.add_argument("--data", type=Path, required=True, help="prompt/completion JSONL")
    p.add_argument("--eval-data", type=Path, default=None, help="prompt/completion JSONL for the eval loss")
    p.add_argument("--form", choices=("defaults", "tuned", "plain"), required=True)
    p.add_argument("--batch-size", type=int, required=True, help="per device: packed rows (tuned) or examples")
    p.add_argument("--max-seq-len", type=int, default=128, help="packed row length (tuned) / truncation")
    p.add_argument("--max-steps", type=int, required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--warmup-ratio", type=float, default=0.1, help="warm-up steps: int(ratio x max_steps)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="tuned form only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lora-r", type=int, default=0)
    p.add_argument("--lora-alpha", type=float, default=16.0)
    p.add_argument("--lora-dropout", type=float, default=0.05)
    p.add_argument("--order", type=Path, default=None, help="plain form: the training order (JSON list of indices)")
    p.add_argument("--dump-tokens", type=Path, default=None, help="write TRL's input_ids and labels here (JSON)")
    p.add_argument("--out-json", type=Path, required=True)
    return p.parse_args()


def read_rows(path: Path) -> Dataset:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return Dataset.from_list([{"prompt": r["prompt"], "completion": r["completion"]} for r in rows])


class FixedOrder(Sampler):
    """The plain form's order, as given, once."""

    def __init__(self, order: list[int]) -> None:
        self.order = order

    def __iter__(self):  # noqa: ANN204
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)


class RecordingTrainer(SFTTrainer):
    """Keeps each micro-batch's loss as this rank computed it (see step_losses)."""

    def __init__(self, *args: Any, order: list[int] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.order = order
        self.losses: list[float] = []

    def _get_train_sampler(self, *args: Any, **kwargs: Any):  # noqa: ANN202
        return FixedOrder(self.order) if self.order is not None else super()._get_train_sampler(*args, **kwargs)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # noqa: ANN001, ANN201
        out = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if model.training:
            self.losses.append(float((out[0] if return_outputs else out).detach()))
        return out


def sft_config(args: argparse.Namespace, out_dir: str) -> SFTConfig:
    common = dict(output_dir=out_dir, per_device_train_batch_size=args.batch_size, max_steps=args.max_steps,
                  learning_rate=args.lr, lr_scheduler_type="linear", warmup_steps=int(args.warmup_ratio * args.max_steps),
                  weight_decay=args.weight_decay, max_grad_norm=1.0, seed=args.seed, data_seed=args.seed,
                  use_cpu=True, save_strategy="no", eval_strategy="no", report_to="none",
                  logging_steps=10, dataloader_num_workers=0, disable_tqdm=True, completion_only_loss=True)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # under torchrun; alone, accelerate would wait for a group
        common["ddp_backend"] = "gloo"
    if args.form == "defaults":
        return SFTConfig(**common)  # bf16, gradient checkpointing, no packing, max_length 1024: TRL's own
    if args.form == "tuned":
        return SFTConfig(**common, bf16=args.precision == "bf16", gradient_checkpointing=False, packing=True,
                         max_length=args.max_seq_len)
    return SFTConfig(**common, bf16=False, gradient_checkpointing=False, max_length=args.max_seq_len)


def build_model(args: argparse.Namespace) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    if not args.lora_r:
        return model
    from peft import LoraConfig, get_peft_model
    config = LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout, bias="none",
                        target_modules="all-linear", task_type="CAUSAL_LM")
    torch.manual_seed(args.seed)  # as corecpu.training.lora.add_lora: the adapters depend on the seed alone
    return get_peft_model(model, config)


def step_losses(losses: list[float], world: int) -> list[float]:
    """Each step's loss over all ranks. SFTTrainer scales a rank's loss (its label tokens' summed loss over the
    label tokens of every rank) by the world size, so the step's token-weighted loss is the ranks' mean."""
    if world == 1:
        return losses
    mine = torch.tensor(losses, dtype=torch.float64)
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    return (torch.stack(every).sum(0) / world).tolist()


@torch.no_grad()
def eval_loss(model: torch.nn.Module, dataset: Dataset, pad_id: int, batch: int = 16, rank: int = 0,
              world: int = 1) -> tuple[float, int]:
    """Mean next-token loss over every label token of `dataset` (TRL-prepared: input_ids, labels), fp32.
    Collective for world > 1: each rank scores every world-th row, as the Trainer's evaluate() shards its
    loader, and the sums meet in one all-reduce (a rank-0-only eval would bill the baseline world x the time)."""
    model.eval()
    total, count = 0.0, 0
    rows = [(r["input_ids"], r["labels"]) for r in dataset][rank::world]
    for i in range(0, len(rows), batch):
        chunk = rows[i:i + batch]
        width = max(len(ids) for ids, _ in chunk)
        ids = torch.tensor([x + [pad_id] * (width - len(x)) for x, _ in chunk])
        labels = torch.tensor([y + [-100] * (width - len(y)) for _, y in chunk])
        mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x, _ in chunk])
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        target = labels[:, 1:]
        total += float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1),
                                                         ignore_index=-100, reduction="sum"))
        count += int((target != -100).sum())
    if world > 1:
        sums = torch.tensor([total, float(count)], dtype=torch.float64)
        dist.all_reduce(sums)
        total, count = float(sums[0]), int(sums[1])
    return total / max(count, 1), count


def main() -> None:
    args = parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    order = json.loads(args.order.read_text()) if args.order else None
    with tempfile.TemporaryDirectory() as out_dir:
        trainer = RecordingTrainer(model=build_model(args), args=sft_config(args, out_dir),
                                   train_dataset=read_rows(args.data),
                                   eval_dataset=read_rows(args.eval_data) if args.eval_data else None,
                                   processing_class=tokenizer, order=order)
        if args.dump_tokens and trainer.is_world_process_zero():
            ds = trainer.train_dataset
            args.dump_tokens.write_text(json.dumps({"input_ids": list(ds["input_ids"]), "labels": list(ds["labels"])}))
        result = trainer.train()
        trainer.save_model(out_dir)  # as a user does: the model (or adapter) to keep; corecpu writes final/
        world = trainer.args.world_size
        losses = step_losses(trainer.losses, world)
        tokens = int(trainer._total_train_tokens)  # TRL's num_tokens: non-pad inputs of every rank
        rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])
        every = [torch.zeros_like(rss) for _ in range(world)]
        dist.all_gather(every, rss) if world > 1 else every.__setitem__(0, rss)
        if world > 1:
            dist.barrier()  # the eval's time starts together on every rank
        started = time.perf_counter()
        held = (eval_loss(trainer.model, trainer.eval_dataset, tokenizer.pad_token_id, rank=trainer.args.process_index,
                          world=world) if trainer.eval_dataset is not None else (math.nan, 0))
        eval_seconds = time.perf_counter() - started
        if trainer.is_world_process_zero():
            args.out_json.parent.mkdir(parents=True, exist_ok=True)
            args.out_json.write_text(json.dumps({
                "form": args.form, "lora_r": args.lora_r, "world": world, "losses": losses,
                "train_seconds": result.metrics["train_runtime"], "tokens": tokens,
                "eval_loss": held[0], "eval_tokens": held[1], "eval_seconds": eval_seconds, "peak_rss_mb": [float(x) for x in every],
                "bf16": trainer.args.bf16, "gradient_checkpointing": trainer.args.gradient_checkpointing,
                "packing": trainer.args.packing}))
        if world > 1:
            dist.barrier()


if __name__ == "__main__":
    main()
