"""Benchmark data figures: length histogram, padding with and without length grouping, a bag-of-words baseline.

    python benchmarks/data_stats.py                      # the paraphrase task, MiniLM tokenizer, 2 ranks x 16
    python benchmarks/data_stats.py --task builtin --ranks 4

No training: padding is computed over one epoch of each sampler's batches exactly as
corecpu's collate pads them. The baseline is a logistic regression on bag-of-words pair
features (words in both sentences, words in only one), trained with numpy.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from corecpu.data.tokenized import TokenizedDataset# noqa: E402
from corecpu.data.types import ClassificationData
from corecpu.training.modeling import load_tokenizer  # noqa: E402
from corecpu.data.sampling import build_loader, set_epoch  # noqa: E402
from corecpu.data.builtin import format_length_stats, length_stats, task_dataset, task_lengths  # noqa: E402

WORD = re.compile(r"[\w$%.,']+|\S")


def bow_features(data: ClassificationData, vocab: dict[str, int]) -> np.ndarray:
    """Binary features: word in both sentences, word in exactly one; single sentences use presence only."""
    x = np.zeros((len(data), 2 * len(vocab) + 1), np.float32)
    x[:, -1] = 1.0  # bias
    pairs = data.text_pairs or [""] * len(data)
    for row, (a, b) in enumerate(zip(data.texts, pairs)):
        wa, wb = set(WORD.findall(a.lower())), set(WORD.findall(b.lower()))
        for w in wa & wb:
            if w in vocab:
                x[row, vocab[w]] = 1.0
        for w in wa ^ wb:
            if w in vocab:
                x[row, len(vocab) + vocab[w]] = 1.0
    return x


def bow_baseline(train: ClassificationData, ev: ClassificationData, min_count: int = 3, steps: int = 300,
                 lr: float = 0.5, l2: float = 1e-3) -> tuple[float, float, int]:
    """(train accuracy, eval accuracy, vocabulary size) of an L2-regularized logistic regression (binary labels)."""
    counts: dict[str, int] = {}
    for t in train.texts + (train.text_pairs or []):
        for w in set(WORD.findall(t.lower())):
            counts[w] = counts.get(w, 0) + 1
    vocab = {w: i for i, w in enumerate(sorted(w for w, c in counts.items() if c >= min_count))}
    xt, xe = bow_features(train, vocab), bow_features(ev, vocab)
    yt, ye = np.asarray(train.labels, np.float32), np.asarray(ev.labels, np.float32)
    w = np.zeros(xt.shape[1], np.float32)
    m = v = np.zeros_like(w)
    for step in range(1, steps + 1):  # Adam on the full batch: converges in a few hundred steps
        p = 1.0 / (1.0 + np.exp(-(xt @ w)))
        grad = xt.T @ (p - yt) / len(yt) + l2 * w
        m = 0.9 * m + 0.1 * grad
        v = 0.999 * v + 0.001 * grad * grad
        w -= lr * 0.1 * (m / (1 - 0.9 ** step)) / (np.sqrt(v / (1 - 0.999 ** step)) + 1e-8)
    return float(((xt @ w > 0) == yt).mean()), float(((xe @ w > 0) == ye).mean()), len(vocab)


def epoch_padding(ds: TokenizedDataset, batch_size: int, world: int, group: bool, pad_to: int,
                  seed: int, epoch: int) -> tuple[float, int]:
    """(pad fraction over all ranks' batches of one epoch, distinct batch widths) as the loader collates them."""
    real = padded = 0
    widths: set[int] = set()
    for rank in range(world):
        loader = build_loader(ds, batch_size, rank, world, seed=seed, group_by_length=group, pad_to_multiple_of=pad_to)
        set_epoch(loader, epoch)
        for batch in loader:
            real += batch["num_tokens"]
            padded += batch["num_padded"]
            widths.add(batch["input_ids"].shape[1])
    return padded / (real + padded), len(widths)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", default="paraphrase")
    p.add_argument("--model", default="default")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-seq-len", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=3, help="padding is averaged over this many epochs")
    args = p.parse_args()

    tokenizer = load_tokenizer(args.model)
    train, ev = task_dataset(args.task, "train", seed=args.seed), task_dataset(args.task, "eval", seed=args.seed)
    print(f"## {args.task}: token lengths (train, {args.model} tokenizer, special tokens included)\n")
    print(format_length_stats(length_stats(task_lengths(args.task, "train", tokenizer, seed=args.seed),
                                           args.max_seq_len)))
    ev_stats = length_stats(task_lengths(args.task, "eval", tokenizer, seed=args.seed), args.max_seq_len)
    print(f"\neval split: {ev_stats.count} examples, mean {ev_stats.mean:.1f}, median {ev_stats.median:g}, "
          f"p95 {ev_stats.p95}, max {ev_stats.max}, {ev_stats.truncated_pct:.1f}% truncated")

    ds = TokenizedDataset(train, tokenizer, args.max_seq_len)
    print(f"\n## padding, {args.ranks} ranks x batch {args.batch_size}, mean of {args.epochs} epochs\n")
    print("| sampler | pad to multiple of | padding (pad / all positions) | distinct widths |")
    print("|---|---:|---:|---:|")
    for group in (False, True):
        for pad_to in (0, 16, 32):
            runs = [epoch_padding(ds, args.batch_size, args.ranks, group, pad_to, args.seed, e)
                    for e in range(args.epochs)]
            frac = sum(r[0] for r in runs) / len(runs)
            print(f"| {'length-grouped' if group else 'random (DistributedSampler)'} | {pad_to or '-'} | "
                  f"{100 * frac:.1f}% | {max(r[1] for r in runs)} |")

    tr_acc, ev_acc, nvocab = bow_baseline(train, ev)
    print(f"\n## bag-of-words logistic regression ({nvocab} words x 2 features): train accuracy {tr_acc:.3f}, "
          f"eval accuracy {ev_acc:.3f}")


if __name__ == "__main__":
    main()
