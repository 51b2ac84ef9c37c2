"""The built-in QA set's figures: lengths, windows, padding, and what a bag-of-words guess scores.

    python benchmarks/qa_data_stats.py                  # MiniLM tokenizer, 384-token windows, stride 128

No training. Padding is counted over one epoch of 2 ranks x batch 16 as corecpu's collate pads
(random and length-grouped batches) and as run_qa.py's default pads (every window to 384).
The baseline is the classic sliding-window guess: the sentence sharing most words with the
question, and in it the longest run of words the question does not contain; scored with
SQuAD's EM/F1 on the eval split.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from corecpu.data.builtin_qa import builtin_qa_dataset  # noqa: E402
from corecpu.data.qa import QAExample, gold_answers  # noqa: E402
from corecpu.data.sampling import grouped_global_batches  # noqa: E402
from corecpu.tasks.qa_features import train_features  # noqa: E402
from corecpu.tasks.qa_metrics import squad_scores  # noqa: E402
from corecpu.training.modeling import load_tokenizer  # noqa: E402

WORD = re.compile(r"[\w,']+")
STOP = frozenset("a an the of in on at to for did does do is was what which who whom when where how many much "
                 "by with from 's".split())


def histogram(lengths: list[int], width: int = 50) -> str:
    top = max(lengths)
    rows = []
    for lo in range(0, top + 1, width):
        n = sum(lo <= x < lo + width for x in lengths)
        rows.append(f"| {lo}-{lo + width - 1} | {n} | {'#' * round(60 * n / len(lengths))} |")
    return "\n".join(["| tokens | contexts | |", "|---|---:|---|", *rows])


def bag_of_words_answer(ex: QAExample) -> str:
    """The longest run of non-question words in the sentence that shares most words with the question."""
    question = {w.lower().strip(",") for w in WORD.findall(ex.question)} - STOP
    sentences = re.findall(r"[^.]+\.?", ex.context)
    best = max(sentences, key=lambda s: len(question & {w.lower().strip(",") for w in WORD.findall(s)}))
    runs, run = [], []
    for word in WORD.findall(best):
        if word.lower().strip(",") in question or word.lower() in STOP:
            runs.append(run)
            run = []
        else:
            run.append(word.strip(","))
    runs.append(run)
    return " ".join(max(runs, key=len))


def padding(lengths: list[int], batches: list[list[int]], pad_to: int | None) -> float:
    real = sum(lengths[i] for b in batches for i in b)
    slots = sum((pad_to or max(lengths[i] for i in b)) * len(b) for b in batches)
    return 1 - real / slots


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="default")
    p.add_argument("--max-seq-len", type=int, default=384)
    p.add_argument("--doc-stride", type=int, default=128)
    args = p.parse_args()
    tok = load_tokenizer(args.model)
    train, held = builtin_qa_dataset("train"), builtin_qa_dataset("eval")
    contexts = list(dict.fromkeys(ex.context for ex in train.examples))
    lengths = sorted(len(ids) for ids in tok(contexts, add_special_tokens=False)["input_ids"])
    print(f"## built-in QA set: {len(train)} train / {len(held)} eval questions, {len(contexts)} train contexts\n")
    print(f"context tokens: mean {statistics.fmean(lengths):.0f}, median {statistics.median(lengths):.0f}, "
          f"p95 {lengths[int(0.95 * len(lengths))]}, max {lengths[-1]}; "
          f"{100 * sum(n > args.max_seq_len - 20 for n in lengths) / len(lengths):.1f}% need a second window\n")
    print(histogram(lengths))
    answers = [len(tok(ex.answer_texts[0], add_special_tokens=False)["input_ids"]) for ex in train.examples]
    print(f"\nanswer tokens: min {min(answers)}, median {statistics.median(answers):.0f}, max {max(answers)}")
    feats = train_features(train.examples, tok, args.max_seq_len, args.doc_stride)
    flen = [len(ids) for ids in feats.input_ids]
    print(f"train windows: {len(feats)} ({len(feats) / len(train):.2f} per question), tokens mean "
          f"{statistics.fmean(flen):.0f}, median {statistics.median(flen):.0f}\n")
    print("| batching (2 ranks x 16, one epoch) | padding (pad / all positions) |\n|---|---:|")
    import random

    order = list(range(len(flen)))
    random.Random(0).shuffle(order)
    random_batches = [order[i:i + 16] for i in range(0, len(order), 16)]
    grouped = [b[r * 16:(r + 1) * 16] for b in grouped_global_batches(flen, 16, 2, 0, 0, True) for r in range(2)]
    grouped = [b for b in grouped if b]
    print(f"| run_qa.py default: every window padded to {args.max_seq_len} | "
          f"{100 * padding(flen, random_batches, args.max_seq_len):.1f}% |")
    print(f"| random batches, padded to their longest (Trainer's dynamic padding) | "
          f"{100 * padding(flen, random_batches, None):.1f}% |")
    print(f"| length-grouped, padded to their longest (corecpu's default) | {100 * padding(flen, grouped, None):.1f}% |")
    guesses = {ex.id: bag_of_words_answer(ex) for ex in held.examples}
    scores = squad_scores(gold_answers(held.examples), guesses)
    print(f"\nbag-of-words guess on the eval split: exact match {scores['exact_match']:.1f}, F1 {scores['f1']:.1f}")


if __name__ == "__main__":
    main()
