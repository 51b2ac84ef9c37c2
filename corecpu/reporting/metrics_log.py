"""metrics.jsonl (rank 0's record of every logged step and evaluation), throughput, the step line."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from corecpu import atomic
from corecpu.reporting.trackers import open_trackers, parse_report_to

if TYPE_CHECKING:
    from corecpu.training.run import Run


class MetricsLog:
    """Rank 0's metrics.jsonl: one JSON object per line, flushed per line so a crash loses nothing.

    Every record written is also sent to each of `trackers` (see corecpu.reporting.trackers) at its step.
    """

    def __init__(self, path: Path, resume_step: int | None, trackers: Sequence[Any] = ()) -> None:
        self.path = path
        self.trackers = list(trackers)
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            atomic.write_text(path, "")
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
            atomic.write_text(path, "".join(k + "\n" for k in kept))  # a kill now keeps the old history whole
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

    def log_model(self, final: Path) -> None:
        """The exported model to each tracker that is asked to keep it (HF_MLFLOW_LOG_ARTIFACTS, WANDB_LOG_MODEL)."""
        for tracker in list(self.trackers):
            try:
                tracker.log_model(final)
            except Exception as exc:  # noqa: BLE001 - the model is saved on disk; a tracker must not end the run
                print(f"warning: {type(tracker).__name__} could not store the model ({exc})", file=sys.stderr,
                      flush=True)

    def close(self) -> None:
        self._file.close()
        for tracker in self.trackers:
            tracker.close()


def log_to(run: "Run", output_dir: str | Path, report_to: str = "none", config: Mapping[str, Any] | None = None,
           resume_step: int | None = None) -> MetricsLog | None:
    """Where a loop of your own sends run.log(): OUTPUT_DIR/metrics.jsonl and the trackers of `report_to`
    (e.g. "tensorboard,mlflow", "all": every one installed; their variables as transformers reads them), opened
    on rank 0 and closed with the run. Call it on every rank. `config`: hyper-parameters for the trackers;
    `resume_step` (run.resumed.step after a resume): keep the records up to it instead of starting afresh.

        corecpu.log_to(run, "runs/mine", report_to="tensorboard")
        run.log({"loss": loss.item(), "learning_rate": lr}, step=step.number)
    """
    names = parse_report_to(report_to)
    log = None
    if run.is_main:
        trackers = open_trackers(names, output_dir, dict(config or {}), rank=run.rank)
        log = MetricsLog(Path(output_dir) / "metrics.jsonl", resume_step, trackers)
        run.on_close(log.close)
    run.on_log(lambda record, step: log.write({"step": step, **record}) if log else None)
    return log


class Throughput:
    """Samples, tokens and model FLOPs per second over each logging interval."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def rates(self, samples: float, tokens: float, flops: float = 0.0) -> tuple[float, float, float]:
        now = time.perf_counter()
        dt, self.t0 = max(now - self.t0, 1e-9), now
        return samples / dt, tokens / dt, flops / dt


def format_step(record: dict[str, Any], total_steps: int, seconds_per_step: float | None = None) -> str:
    """The step line: the record's figures, then, given `seconds_per_step` (since the loop started), the time
    so far and to go; a log file off a terminal has no progress bar to say them."""
    epoch = f" | epoch {record['epoch']:.2f}" if isinstance(record.get("epoch"), float) else ""
    line = (f"step {record['step']:>6}/{total_steps}{epoch} | loss {record['loss']:.4f} | lr {record['lr']:.2e} | "
            + (f"grad_norm {record['grad_norm']:.3g} | " if record.get("grad_norm") is not None else "")
            + f"{record['samples_per_s']:8.1f} samples/s | {record['tokens_per_s']:9.0f} tokens/s")
    line += f" | padding {record['padding']:.0%}" if "padding" in record else ""
    line += f" | MFU {record['mfu']:.1%}" if "mfu" in record else ""
    line += f" | wait {record['wait']:.0%}" if "wait" in record else ""
    if seconds_per_step is not None and "elapsed_s" in record:
        eta = max(total_steps - record["step"], 0) * seconds_per_step
        line += (f" | {seconds_per_step:.2f} s/step | elapsed {clock(record['elapsed_s'])} | eta {clock(eta)}")
    return line


def clock(seconds: float) -> str:
    """1:02:03 / 2:03: hours only when there are any."""
    s = int(round(seconds))
    h, m, s = s // 3600, s // 60 % 60, s % 60
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
