"""metrics.jsonl (rank 0's record of every logged step and evaluation), throughput, the step line."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from corecpu import atomic


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
    line += f" | padding {record['padding']:.0%}" if "padding" in record else ""
    return line + (f" | MFU {record['mfu']:.1%}" if "mfu" in record else "")
