"""QA baseline for benchmarks/qa_throughput.py: Hugging Face `Trainer` as run_qa.py drives it, on CPU.

    torchrun --standalone --nproc-per-node 2 benchmarks/hf_trainer_qa.py --out-json run.json              # run_qa defaults
    torchrun --standalone --nproc-per-node 2 benchmarks/hf_trainer_qa.py --tuned --out-json run.json      # tuned

run_qa.py's pipeline with Trainer's defaults except what the comparison holds equal (corecpu's lr,
weight decay, warm-up steps, clipping, per-device batch, epochs, seed, ddp_backend gloo):
  defaults  pad_to_max_length=True: every window padded to --max-seq-len (384), random sampling, fp32
  --tuned   dynamic padding (DataCollatorWithPadding), train_sampling_strategy group_by_length, bf16=True
Features and post-processing are run_qa.py's algorithm (windows of 384 with stride 128, CLS labels
for answers outside a window, n-best 20 / max answer 30 span search); this script takes them from
corecpu.tasks.qa_features / qa_postprocess, so that only the training loop differs between the
variants. Evaluation: trainer.predict on the eval windows (gathered across ranks by Trainer), then
post-processing and SQuAD's EM/F1, after training, as run_qa.py does with --do_eval.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from transformers import DataCollatorWithPadding, TrainingArguments

from common import DEFAULTS, write_records  # benchmarks/ on sys.path
from hf_trainer import Recorder, RecordingTrainer, step_records
from corecpu.data.builtin_qa import builtin_qa_dataset
from corecpu.data.qa import gold_answers, load_qa
from corecpu.tasks.qa_features import QAFeatures, eval_features, train_features
from corecpu.tasks.qa_metrics import squad_scores
from corecpu.tasks.qa_postprocess import postprocess
from corecpu.training.modeling import load_qa_model, load_tokenizer


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="default")
    p.add_argument("--data", default="qa", help="'qa' (built-in) or a SQuAD .json / flat .jsonl file")
    p.add_argument("--eval-data", default="auto", help="auto: the built-in's eval split; else a file")
    p.add_argument("--version-2-with-negative", action="store_true")
    p.add_argument("--batch-size", type=int, default=DEFAULTS.batch_size, help="per device")
    p.add_argument("--max-seq-len", type=int, default=384)
    p.add_argument("--doc-stride", type=int, default=128)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--tuned", action="store_true", help="dynamic padding + group_by_length + bf16")
    p.add_argument("--precision", choices=("fp32", "bf16"), default=None,
                   help="override the form's precision (defaults: fp32; --tuned: bf16)")
    p.add_argument("--seed", type=int, default=DEFAULTS.seed)
    p.add_argument("--lr", type=float, default=DEFAULTS.lr)
    p.add_argument("--out-json", type=Path, required=True)
    return p.parse_args()


def load(spec: str, split: str, v2: bool):
    if spec == "qa":
        return builtin_qa_dataset(split, with_impossible=v2)
    return load_qa(spec, split=split, allow_impossible=v2)


def items(features: QAFeatures, train: bool) -> list[dict]:
    out = []
    for i in range(len(features)):
        item = {"input_ids": features.input_ids[i], "attention_mask": [1] * len(features.input_ids[i])}
        if features.token_type_ids is not None:
            item["token_type_ids"] = features.token_type_ids[i]
        if train:
            item["start_positions"], item["end_positions"] = features.start_positions[i], features.end_positions[i]
        out.append(item)
    return out


def main() -> None:
    args = parse_args()
    train = load(args.data, "train", args.version_2_with_negative)
    held = load(args.data if args.eval_data == "auto" else args.eval_data, "eval", args.version_2_with_negative)
    tokenizer = load_tokenizer(args.model)
    train_feats = train_features(train.examples, tokenizer, args.max_seq_len, args.doc_stride)
    eval_feats = eval_features(held.examples, tokenizer, args.max_seq_len, args.doc_stride)
    model, _ = load_qa_model(args.model, args.seed)

    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_epoch = math.ceil(len(train_feats) / (args.batch_size * world))
    steps = min(per_epoch * args.epochs, args.max_steps) if args.max_steps else per_epoch * args.epochs
    precision = args.precision or ("bf16" if args.tuned else "fp32")
    # run_qa.py's default pads in the tokenizer (padding="max_length"); padding in the collator is the same tensors.
    collator = (DataCollatorWithPadding(tokenizer) if args.tuned else
                DataCollatorWithPadding(tokenizer, padding="max_length", max_length=args.max_seq_len))
    workdir = tempfile.mkdtemp(prefix="hf-trainer-qa-")
    training_args = TrainingArguments(
        output_dir=workdir, use_cpu=True, ddp_backend="gloo" if world > 1 else None,
        bf16=precision == "bf16", per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size, num_train_epochs=args.epochs,
        max_steps=steps if args.max_steps else -1, learning_rate=args.lr, weight_decay=DEFAULTS.weight_decay,
        max_grad_norm=DEFAULTS.max_grad_norm, warmup_steps=int(DEFAULTS.warmup_ratio * steps), seed=args.seed,
        train_sampling_strategy="group_by_length" if args.tuned else "random",
        eval_strategy="no", logging_strategy="no", save_strategy="no", report_to="none", disable_tqdm=True,
        dataloader_num_workers=0,
    )
    recorder = Recorder()
    trainer = RecordingTrainer(model=model, args=training_args, train_dataset=items(train_feats, True),
                               processing_class=tokenizer, data_collator=collator, callbacks=[recorder])
    trainer.train()
    sampling = training_args.train_sampling_strategy  # recorded before evaluation switches it off below
    # run_qa.py --do_eval: predict on every eval window (Trainer shards and gathers), then post-process.
    # With group_by_length, transformers 5's Trainer also length-groups the *eval* sampler, so predict()
    # returns the windows shuffled and feature-order post-processing reads other windows' logits (measured
    # here: EM 0.00 instead of about 30). Predict in dataset order, as post-processing needs.
    trainer.args.train_sampling_strategy = "random"
    out = trainer.predict(items(eval_feats, False))
    start_logits, end_logits = out.predictions[:2] if isinstance(out.predictions, tuple) else out.predictions
    n = len(eval_feats)
    start_logits, end_logits = np.asarray(start_logits)[:n], np.asarray(end_logits)[:n]
    answers = postprocess(held.examples, eval_feats, list(start_logits), list(end_logits),
                          allow_impossible=args.version_2_with_negative)
    scores = squad_scores(gold_answers(held.examples), answers.predictions, version_2=args.version_2_with_negative)
    shutil.rmtree(workdir, ignore_errors=True)

    records = step_records(trainer, recorder, world)
    if records is not None:
        k = len(records)
        evals = [{"step": k, "eval_exact_match": scores.get("exact_match", scores.get("exact")),
                  "eval_f1": scores["f1"], "eval_examples": len(held.examples)}]
        write_records(args.out_json, "hf_trainer_qa", records, evals, world_size=world, precision=precision,
                      omp_num_threads=os.environ.get("OMP_NUM_THREADS"), torch_threads=torch.get_num_threads(),
                      sampling=sampling, padding="dynamic" if args.tuned else "max_length")
        print(f"hf_trainer_qa: {k} steps, final loss {records[-1]['loss']:.4f}, exact match "
              f"{evals[0]['eval_exact_match']:.2f}, F1 {evals[0]['eval_f1']:.2f}")


if __name__ == "__main__":
    main()
