"""The checkpointer a loop hands to run.wrap(): it resumes, and it saves when a save is due.

    ckpt = corecpu.Checkpoints("runs/mine", every=100, keep=2)     # resume="auto" by default
    model, opt = run.wrap(model, opt, loader=loader, checkpoint=ckpt)   # resumes here, before IPEX/DDP
    for step in run.steps(loader, epochs=3):
        ...
        ckpt.save(step)                                              # every 100 steps and the last one

It carries what the run already knows (model, optimizer, scheduler, the resolved choices,
the loop position) so a save takes only the step; it pauses the watchdog while it writes.
The files are corecpu.training.checkpoint's: verified, atomic, the newest `keep` kept.
A fresh start (nothing to resume) moves an earlier run's outputs in the directory aside.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from corecpu import atomic
from corecpu.errors import CoreCPUError
from corecpu.training import checkpoint, outputs
from corecpu.training.checkpoint import LoopState
from corecpu.training.steps import Step

STOPPED = "stopped.json"  # written when a stop signal ended the run with a checkpoint; removed by the next start

if TYPE_CHECKING:  # the run calls in here from wrap(); a real import would be a cycle
    from corecpu.training.run import Run


class Checkpoints:
    def __init__(self, output_dir: str | Path, *, every: int = 0, keep: int = 2, resume: str = "auto",
                 config: dict[str, Any] | None = None) -> None:
        """`every`: save every N optimizer steps (0: only the last step, and on a stop signal).
        `resume`: "auto" (the newest checkpoint that verifies, if any), "" (start fresh) or a step-* directory.
        `config`: JSON-serialisable settings stored with each checkpoint; run-defining ones (corecpu.training.
        checkpoint.RUN_DEFINING) and `label_names` are compared on resume."""
        if every < 0 or keep < 1:
            raise CoreCPUError(f"checkpoints every {every} steps keeping {keep}: use every >= 0 "
                                          "and keep >= 1")
        self.output_dir, self.every, self.keep, self.resume_from = Path(output_dir), every, keep, resume
        self.config = dict(config or {})
        self.resumed: LoopState | None = None
        self.notes: list[str] = []  # checkpoints skipped on resume, changed settings, outputs moved aside
        self._run: Run | None = None
        self._state: tuple[torch.nn.Module, Any, Any] | None = None
        self._saved: tuple[int, Path | None] | None = None

    # ------------------------------------------------------------ called by run.wrap()
    def restore(self, run: "Run", model: torch.nn.Module, optimizer: Any, scheduler: Any) -> LoopState | None:
        """Load the checkpoint to resume from into the unwrapped model and plain optimizer (collective)."""
        self._run = run
        self.config["resolved"] = run.resolved()
        self.resumed = checkpoint.resume(self.output_dir, self.resume_from, model=model, optimizer=optimizer,
                                         scheduler=scheduler, config=self.config)
        self.notes = list(self.resumed.notes) if self.resumed else []
        if run.is_main and (moved := outputs.set_aside_earlier_run(self.output_dir, resuming=self.resumed is not None)):
            self.notes.append(moved)
        if run.is_main:
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
    def due(self, step: Step) -> bool:
        return step.is_last or (self.every > 0 and step.number % self.every == 0)

    def save(self, step: Step, *, force: bool = False) -> Path | None:
        """Collective: every rank calls it after `step`'s optimizer step. Writes when due (or `force`),
        once per step; returns the checkpoint directory on rank 0, None elsewhere and when not due."""
        if not (force or self.due(step)):
            return None
        if self._saved is not None and self._saved[0] == step.number:
            return self._saved[1]  # a stop signal right after a due save: the files are already there
        if self._run is None or self._state is None:
            raise CoreCPUError("Checkpoints.save() before run.wrap(model, optimizer, checkpoint=...)")
        model, optimizer, scheduler = self._state
        if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
            kept = f"; {self._saved[1] or 'the last checkpoint'} (step {self._saved[0]}) is kept" if self._saved else ""
            raise CoreCPUError(f"the model's weights are not finite at step {step.number} (training diverged); "
                               f"not saved{kept}; lower the learning rate or check the data")
        epoch, batches = step.position
        with self._run.untimed(f"the checkpoint write of step {step.number}", kind="checkpoint"):
            path = checkpoint.save(self.output_dir, step=step.number, model=model, optimizer=optimizer,
                                   scheduler=scheduler, epoch=epoch, batches_in_epoch=batches,
                                   config=self.config, keep=self.keep)
        self._saved = (step.number, path)
        return path
