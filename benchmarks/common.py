"""What the baseline scripts (hf_trainer.py, plain_ddp.py) share: flags, data, tokenization, records.

Defaults come from corecpu's own configuration (train.py with no flags), so a baseline trains with corecpu's lr,
weight decay, warm-up, clipping, batch and sequence length unless told otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from corecpu.data.sources import load_data
from corecpu.data.types import ClassificationData
from corecpu.tasks.registry import parse_config

DEFAULTS = parse_config([])  # train.py's defaults: classification, its max_seq_len resolved


def parse_baseline_args(description: str, batch_help: str = "per rank") -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="default", help="'default' (all-MiniLM-L6-v2), 'tiny' or a model directory")
    p.add_argument("--data", default="paraphrase", help="a built-in data set name or a .tsv/.csv/.jsonl file")
    p.add_argument("--eval-data", default="auto", help="a file, or auto: the built-in's eval split")
    for col in ("text-column", "text-pair-column", "label-column"):
        p.add_argument(f"--{col}", default="", help="column name or 0-based index (files only)")
    p.add_argument("--batch-size", type=int, default=DEFAULTS.batch_size, help=batch_help)
    p.add_argument("--max-seq-len", type=int, default=DEFAULTS.max_seq_len)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many optimizer steps (0: all epochs)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--group-by-length", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--seed", type=int, default=DEFAULTS.seed)
    p.add_argument("--lr", type=float, default=DEFAULTS.lr)
    p.add_argument("--weight-decay", type=float, default=DEFAULTS.weight_decay)
    p.add_argument("--warmup-ratio", type=float, default=DEFAULTS.warmup_ratio)
    p.add_argument("--max-grad-norm", type=float, default=DEFAULTS.max_grad_norm)
    p.add_argument("--out-json", type=Path, required=True, help="rank 0 writes the step and eval records here")
    return p.parse_args()


def _column(value: str) -> str | int | None:
    return None if value == "" else int(value) if value.isdigit() else value


def load_train_eval(args: argparse.Namespace) -> tuple[ClassificationData, ClassificationData]:
    """Train and eval data exactly as train.py reads them (same loader, same column rules)."""
    columns = {k: _column(getattr(args, k)) for k in ("text_column", "text_pair_column", "label_column")}
    train = load_data(args.data, split="train", **columns)
    eval_spec = args.data if args.eval_data == "auto" else args.eval_data
    return train, load_data(eval_spec, split="eval", label_names=train.label_names, **columns)


def tokenize(data: ClassificationData, tokenizer: Any, max_seq_len: int) -> list[dict[str, Any]]:
    """One dict per example (truncated, unpadded), as the Trainer and DataCollatorWithPadding expect."""
    enc = tokenizer(data.texts, data.text_pairs, truncation=True, max_length=max_seq_len)
    return [{**{k: enc[k][i] for k in enc}, "labels": data.labels[i]} for i in range(len(data))]


def total_steps(num_examples: int, global_batch: int, epochs: int, max_steps: int) -> int:
    """Optimizer steps of the run, as corecpu counts them (ceil per epoch, capped by max_steps)."""
    total = math.ceil(num_examples / global_batch) * epochs
    return min(total, max_steps) if max_steps else total


def write_records(path: Path, variant: str, steps: list[dict[str, Any]], evals: list[dict[str, Any]],
                  **extra: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"variant": variant, **extra, "steps": steps, "evals": evals}))


def bert_base_random(work: Path, vocab: Path | None = None) -> Path:
    """A BERT-base-shaped classifier (110M parameters, random init, the tokenizer in `vocab`, default MiniLM's
    30,522-token one) on disk: `--model bert-base`, for machines that can fetch no weights (issue 29's
    air-gapped node)."""
    target = work / "bert-base-random"
    if (target / "config.json").exists():
        return target
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from corecpu.training.modeling import default_model_dir

    tokenizer = AutoTokenizer.from_pretrained(vocab or default_model_dir())
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=tokenizer.vocab_size, num_labels=2))
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def llama_1b_random(work: Path) -> Path:
    """A Llama-3.2-1B-shaped causal LM (hidden 2048, 16 layers, 32 heads, 8 key/value heads, intermediate 8192; random
    init, 1.07B parameters, 4.3 GB) on disk, with llama-135m's tokenizer padded with unused tokens to its 49,152-row
    tied head: the LoRA benchmarks' large model on machines that fetch no weights.

        python -c 'import sys; sys.path.insert(0, "benchmarks"); import common, pathlib; print(common.llama_1b_random(pathlib.Path("/tmp")))'
    """
    target = work / "llama-1b-shape"
    if (target / "config.json").exists():
        return target
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from corecpu.training.builtin_models import builtin_model_dir
    from corecpu.training.modeling import load_tokenizer

    source = builtin_model_dir("llama-135m")
    tokenizer = load_tokenizer("llama-135m")
    config = LlamaConfig.from_pretrained(source)
    config.update({"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
                   "intermediate_size": 8192, "head_dim": 64})
    tokenizer.add_tokens([f"<unused_{i}>" for i in range(config.vocab_size - len(tokenizer))], special_tokens=True)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target
