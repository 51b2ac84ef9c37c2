"""The step-shaped loop: `for step in run.steps(loader, epochs=3, grad_accum=2)`.

    for step in run.steps(loader, epochs=3, grad_accum=2):   # epochs, the resume position, stop signals
        for batch in step.micro_batches():                    # no_sync on all but the last
            step.backward(loss_fn(model(batch)))              # divided by the group's true length
        optimizer.step(); optimizer.zero_grad(set_to_none=True)
        checkpoints.save(step)                                # saves when due: every N, the last step

Between two steps it tells the watchdog a step was made and asks every rank whether a stop
signal arrived (one tiny all-reduce); if one did, it saves through the run's checkpointer
and exits 75 with one line. The position is held here, so a resumed run needs no skip
arithmetic: the loader's sampler slices off the batches already seen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from torch.utils.data import DataLoader

from corecpu.data.sampling import set_epoch
from corecpu.errors import CoreCPUError
from corecpu.training.schedule import Schedule

if TYPE_CHECKING:  # the run drives this module; a real import would be a cycle
    import torch

    from corecpu.training.run import Run

_END = object()


class Step:
    """One optimizer step: its micro-batches, and where it sits in the run."""

    def __init__(self, loop: "Steps", it: Iterator[Any], *, number: int, epoch: int, first_micro: int,
                 group_len: int, ends_epoch: bool, is_last: bool, divisor: int | None = None) -> None:
        self._loop, self._it = loop, it
        self.number = number  # 1-based: the optimizer step this body performs
        self.epoch = epoch  # 0-based
        self.first_micro = first_micro  # this step's first micro-batch within the epoch
        self.group_len = group_len  # micro-batches in this step (the epoch's last group may be short)
        self.divisor = divisor or group_len  # its accumulation group's length (more, after a resume mid-group)
        self.ends_epoch = ends_epoch
        self.is_last = is_last
        self.consumed = 0

    def micro_batches(self) -> Iterator[Any]:
        """This step's batches. Gradients are all-reduced only during the last one's backward."""
        run = self._loop.run
        for i in range(self.group_len):
            batch = next(self._it, _END)
            if batch is _END:
                raise CoreCPUError(f"the loader ran out after {self.first_micro + i} batches of epoch {self.epoch}, "
                                   f"{self._loop.schedule.micro_per_epoch} expected; give run.steps() the loader "
                                   "whose batches it counts")
            self.consumed += 1
            with run.no_sync(run.model, sync=i == self.group_len - 1):
                yield batch

    def backward(self, loss: "torch.Tensor") -> None:
        """loss.backward() scaled so that the step averages over all its micro-batches."""
        (loss / self.divisor).backward()

    @property
    def epochs(self) -> int:
        return self._loop.schedule.epochs

    @property
    def position(self) -> tuple[int, int]:
        """(epoch, micro-batches consumed in it) once this step is done: where a resume starts.
        At an epoch's end that is the start of the next epoch."""
        if self.ends_epoch:
            return self.epoch + 1, 0
        return self.epoch, self.first_micro + self.group_len


class Steps:
    """The steps of a run over `loader`; iterate it after run.wrap(), which knows the resume position."""

    def __init__(self, run: "Run", loader: DataLoader, schedule: Schedule) -> None:
        self.run, self.loader, self.schedule = run, loader, schedule
        self.completed = 0  # optimizer steps done so far (a resumed run starts at its checkpoint's)

    @property
    def total(self) -> int:
        return self.schedule.total_steps

    def __iter__(self) -> Iterator[Step]:
        sched = self.schedule
        start = self.run.resumed
        step, epoch, micro = (start.step, start.epoch, start.batches_in_epoch) if start else (0, 0, 0)
        self.completed = step
        watchdog = self.run.start_watchdog()
        try:
            while not sched.finished(step, epoch):
                set_epoch(self.loader, epoch, skip_batches=micro)
                it = iter(self.loader)
                while micro < sched.micro_per_epoch:
                    # To the end of micro's accumulation group: a resume lands on a group's start, unless
                    # grad_accum changed since the checkpoint; then the first step finishes the group.
                    group = sched.group_len(micro)
                    n = micro - micro % sched.grad_accum + group - micro
                    current = Step(self, it, number=step + 1, epoch=epoch, first_micro=micro, group_len=n,
                                   ends_epoch=sched.epoch_done(micro + n), is_last=step + 1 >= sched.total_steps,
                                   divisor=group)
                    self.run._late.step = current.number
                    yield current
                    if current.consumed != n:
                        raise CoreCPUError(f"step {current.number} used {current.consumed} of its {n} micro-batches; "
                                           "iterate step.micro_batches() to the end in every step")
                    step, micro = step + 1, micro + n
                    self.completed = step
                    watchdog.progress(step)
                    if current.is_last:
                        return
                    self.run.stop_if_signalled(current)
                epoch, micro = epoch + 1, 0
        finally:
            watchdog.stop()
