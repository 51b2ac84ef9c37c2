"""Metrics: classification scores from summed counts, the JSONL log, throughput, and the progress bar.

Scores are computed from counts (loss sum, examples, per-class TP/FP/FN) so that
summing the counts over ranks and then computing gives exactly the score of
the whole evaluation set, whatever way it was sharded.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


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


class MetricsLog:
    """Rank 0's metrics.jsonl: one JSON object per line, flushed per line so a crash loses nothing.

    Every record written is also sent to each of `trackers` (see corecpu.tracking) at its step.
    """

    def __init__(self, path: Path, resume_step: int | None, trackers: Sequence[Any] = ()) -> None:
        self.path = path
        self.trackers = list(trackers)
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            path.write_text("")
        else:
            # Drop records written after the checkpoint we resume from; the resumed
            # run writes those steps again, and a reader must see each step once.
            kept = []
            if path.exists():
                for line in path.read_text().splitlines():
                    try:
                        if json.loads(line).get("step", 0) <= resume_step:
                            kept.append(line)
                    except json.JSONDecodeError:
                        pass  # a line torn by the crash we are resuming from
            path.write_text("".join(k + "\n" for k in kept))
        self._file = path.open("a")

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        for tracker in list(self.trackers):
            try:
                tracker.log(record, step=int(record.get("step", 0)))
            except Exception as exc:  # noqa: BLE001 - metrics.jsonl stays the record; a tracker must not end the run
                print(f"warning: {type(tracker).__name__} failed ({exc}); no longer reporting to it",
                      file=sys.stderr, flush=True)
                self.trackers.remove(tracker)

    def close(self) -> None:
        self._file.close()
        for tracker in self.trackers:
            tracker.close()


class Throughput:
    """Samples and tokens per second over each logging interval."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def rates(self, samples: float, tokens: float) -> tuple[float, float]:
        now = time.perf_counter()
        dt, self.t0 = max(now - self.t0, 1e-9), now
        return samples / dt, tokens / dt


def format_step(record: dict[str, Any], total_steps: int) -> str:
    line = (f"step {record['step']:>6}/{total_steps} | loss {record['loss']:.4f} | lr {record['lr']:.2e} | "
            f"{record['samples_per_s']:8.1f} samples/s | {record['tokens_per_s']:9.0f} tokens/s")
    return line + (f" | padding {record['padding']:.0%}" if "padding" in record else "")


def on_terminal() -> bool:
    # Under mpirun rank 0 writes into a pipe; launch.sh says whether that pipe ends at a terminal.
    return sys.stdout.isatty() or os.environ.get("CORECPU_TTY") == "1"


def make_console() -> Console:
    return Console(highlight=False, soft_wrap=True, force_terminal=True if on_terminal() else None)


def make_progress(mode: str, console: Console) -> Progress | None:
    """A rich progress bar, or None where it would only clutter a log file."""
    if mode == "off" or (mode == "auto" and not on_terminal()):
        return None
    return Progress(
        TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=False,
    )
