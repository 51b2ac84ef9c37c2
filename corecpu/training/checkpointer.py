"""The checkpointer a loop hands to run.wrap(): it resumes, and it saves when a save is due.

    ckpt = corecpu.Checkpoints("runs/mine", every=100, keep=2)     # resume="auto" by default
    model, opt = run.wrap(model, opt, loader=loader, checkpoint=ckpt)   # resumes here, before IPEX/DDP
    for step in run.steps(loader, epochs=3):
        ...
        ckpt.note_eval(step, scores)                                 # with best="eval_f1": a new best is saved
        ckpt.save(step)                                              # every 100 steps and the last one

It knows nothing of the run: wrap() hands it what it needs (the plain model to restore into, the
resolved choices to compare, whether this rank writes, how to pause the watchdog), and a save takes
only the step.
The files are corecpu.training.checkpoint_state's: verified, atomic, the newest `keep` kept, and with
`best` (--keep-best) the checkpoint of the best evaluation too: a step whose evaluation is a new best is
saved even when no save is due, and its name travels in every later checkpoint's meta.json ("extra":
{"best": ...}) so that a resumed run keeps protecting it.
A fresh start (nothing to resume) moves an earlier run's outputs in the directory aside.
"""

from __future__ import annotations

import json
import contextlib
from pathlib import Path
from typing import Any, Callable, ContextManager, Protocol, Sequence

import torch

from corecpu import atomic
from corecpu.errors import CoreCPUError
from corecpu.training import checkpoint_state, outputs
from corecpu.training.best_metric import BestMetric
from corecpu.training.checkpoint_state import PREFIX, LoopState

STOPPED = "stopped.json"  # written when a stop signal ended the run with a checkpoint; removed by the next start


class StepDone(Protocol):
    """What a save needs of a step (corecpu.training.steps.Step has it)."""

    number: int  # 1-based optimizer step
    is_last: bool

    @property
    def position(self) -> tuple[int, int]: ...  # (epoch, micro-batches consumed in it): where a resume starts


def _not_paused(phase: str, kind: str = "other") -> ContextManager[None]:
    return contextlib.nullcontext()


class Checkpoints:
    def __init__(self, output_dir: str | Path, *, every: int = 0, keep: int = 2, resume: str = "auto",
                 config: dict[str, Any] | None = None, compare: Sequence[str] = checkpoint_state.RUN_DEFINING,
                 best: str = "") -> None:
        """`every`: save every N optimizer steps (0: only the last step, and on a stop signal).
        `best`: an eval metric (corecpu.training.best_metric: "eval_f1", "eval_loss", "acc:max"); the checkpoint of
        the best evaluation handed to note_eval() is saved and kept beside the newest `keep`.
        `resume`: "auto" (the newest checkpoint that verifies, if any), "" (start fresh) or a step-* directory.
        `config`: JSON-serialisable settings stored with each checkpoint; run-defining ones (corecpu.training.
        checkpoint_state.RUN_DEFINING, or the names in `compare`) and `label_names` are compared on resume."""
        if every < 0 or keep < 1:
            raise CoreCPUError(f"checkpoints every {every} steps keeping {keep}: use every >= 0 "
                                          "and keep >= 1")
        self.output_dir, self.every, self.keep, self.resume_from = Path(output_dir), every, keep, resume
        self.config, self.compare = dict(config or {}), tuple(compare)
        self.resumed: LoopState | None = None
        self.notes: list[str] = []  # checkpoints skipped on resume, changed settings, outputs moved aside
        self._untimed: Callable[[str, str], ContextManager[None]] = _not_paused
        self._restored = False
        self._state: tuple[torch.nn.Module, Any, Any] | None = None
        self._saved: tuple[int, Path | None] | None = None
        self.best_metric = BestMetric.parse(best) if best else None
        self.best: dict[str, Any] | None = None  # {"metric", "value", "step", "checkpoint"}: saved, so kept
        self._evaluated: tuple[int, dict[str, float]] | None = None  # the last note_eval(): (step, scores)

    # ------------------------------------------------------------ called by run.wrap()
    def restore(self, model: torch.nn.Module, optimizer: Any, scheduler: Any, *, resolved: dict[str, Any],
                is_main: bool, untimed: Callable[[str, str], ContextManager[None]] = _not_paused) -> LoopState | None:
        """Load the checkpoint to resume from into the unwrapped model and plain optimizer (collective).
        `resolved`: the run's machine-dependent choices, stored and compared on resume; `is_main`: this rank
        writes the shared files; `untimed(phase, kind)`: how a write pauses the watchdog."""
        self._untimed, self._restored = untimed, True
        self.config["resolved"] = resolved
        self.resumed = checkpoint_state.resume(self.output_dir, self.resume_from, model=model, optimizer=optimizer,
                                         scheduler=scheduler, config=self.config, compare=self.compare)
        self.notes = list(self.resumed.notes) if self.resumed else []
        was = (self.resumed.extra.get("best") if self.resumed else None) or {}
        if self.best_metric and was.get("metric") == self.best_metric.name:
            self.best = was  # another metric's best (--keep-best changed) is no longer protected
        if is_main and (moved := outputs.set_aside_earlier_run(self.output_dir, resuming=self.resumed is not None)):
            self.notes.append(moved)
        if is_main:
            (self.output_dir / STOPPED).unlink(missing_ok=True)  # this run continues (or replaces) the stopped one
        return self.resumed

    def mark_stopped(self, signal_name: str, step: int, path: Path | None) -> None:
        """Rank 0: OUTPUT_DIR/stopped.json after a stop signal's checkpoint. Requeue scripts test for it:
        exit code 75 does not survive every launcher (torchrun reports 1), the file does."""
        record = {"signal": signal_name, "step": step, "checkpoint": str(path) if path else None, "exit_code": 75,
                  "resume": "--resume auto"}
        atomic.write_text(self.output_dir / STOPPED, json.dumps(record) + "\n")

    def attach(self, model: torch.nn.Module, optimizer: Any, scheduler: Any) -> None:
        """What to save from now on: the wrapped model (saved unwrapped) and the optimizer in use."""
        self._state = (model, optimizer, scheduler)

    # ------------------------------------------------------------ called by the loop
    def due(self, step: StepDone) -> bool:
        return step.is_last or (self.every > 0 and step.number % self.every == 0) or self._new_best(step.number)

    def note_eval(self, step: StepDone | int, scores: dict[str, float]) -> None:
        """The evaluation after optimizer step `step` (the same scores on every rank); call it before save(step).
        With `best`, a new best makes that step's save due."""
        number = step if isinstance(step, int) else step.number
        if self.best_metric and self.best_metric.name not in scores:
            have = ", ".join(k for k in scores if k.startswith("eval_") and k != "eval_examples")
            raise CoreCPUError(f"--keep-best {self.best_metric.name}: the evaluation reports no such metric; use one "
                               f"of {have}")
        self._evaluated = (number, dict(scores))

    def _new_best(self, number: int) -> bool:
        if not self.best_metric or self._evaluated is None or self._evaluated[0] != number:
            return False
        return self.best_metric.better(float(self._evaluated[1][self.best_metric.name]),
                                       self.best["value"] if self.best else None)

    def save(self, step: StepDone, *, force: bool = False) -> Path | None:
        """Collective: every rank calls it after `step`'s optimizer step. Writes when due (or `force`),
        once per step; returns the checkpoint directory on rank 0, None elsewhere and when not due."""
        if not (force or self.due(step)):
            return None
        if self._saved is not None and self._saved[0] == step.number:
            return self._saved[1]  # a stop signal right after a due save: the files are already there
        if not self._restored or self._state is None:
            raise CoreCPUError("Checkpoints.save() before run.wrap(model, optimizer, checkpoint=...)")
        model, optimizer, scheduler = self._state
        if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
            kept = f"; {self._saved[1] or 'the last checkpoint'} (step {self._saved[0]}) is kept" if self._saved else ""
            raise CoreCPUError(f"the model's weights are not finite at step {step.number} (training diverged); "
                               f"not saved{kept}; lower the learning rate or check the data")
        epoch, batches = step.position
        best = self.best
        if self._new_best(step.number):
            assert self.best_metric is not None and self._evaluated is not None
            best = {"metric": self.best_metric.name, "value": float(self._evaluated[1][self.best_metric.name]),
                    "step": step.number, "checkpoint": f"{PREFIX}{step.number:08d}"}
        extra = {"best": best} if best else {}
        if self._evaluated and self._evaluated[0] == step.number:
            extra["eval"] = self._evaluated[1]  # what this checkpoint scored: `corecpu export --step best` reads it
        with self._untimed(f"the checkpoint write of step {step.number}", "checkpoint"):
            path = checkpoint_state.save(self.output_dir, step=step.number, model=model, optimizer=optimizer,
                                   scheduler=scheduler, epoch=epoch, batches_in_epoch=batches, extra=extra,
                                   config=self.config, keep=self.keep, keep_also=[best["checkpoint"]] if best else [])
        self._saved, self.best = (step.number, path), best
        return path
