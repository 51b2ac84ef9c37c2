"""The step-shaped loop: `for step in run.steps(loader, epochs=3, grad_accum=2)`.

    for step in run.steps(loader, epochs=3, grad_accum=2):   # epochs, the resume position, stop signals
        for batch in step.micro_batches():                    # no_sync on all but the last
            step.backward(loss_fn(model(batch)))              # divided by the group's true length
        optimizer.step(); optimizer.zero_grad(set_to_none=True)
        checkpoints.save(step)                                # saves when due: every N, the last step

Between two steps it tells the watchdog a step was made and asks every rank whether a stop
signal arrived (one tiny all-reduce, or through the shared optimizer step's memory); if one
did, it saves through wrap()'s checkpointer and exits 75 with one line. The position is held here, so a resumed run needs no skip
arithmetic: the loader's sampler slices off the batches already seen.

run.steps() hands a `Steps` what it works with: the loop clock (the step number, the watchdog),
and wrap()'s result, read when iteration starts (steps are usually made before wrap(), to size an
LR schedule). It writes nothing of the run's.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, ContextManager, Iterator, Sequence

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from corecpu.data.sampling import set_epoch
from corecpu.distributed import process_group as _pg
from corecpu.errors import CoreCPUError
from corecpu.reliability import preempt
from corecpu.training.loop_clock import LoopClock
from corecpu.training.schedule import Schedule
from corecpu.training.wrapping import Wrapped

_END = object()


def no_sync(model: torch.nn.Module | None, sync: bool) -> ContextManager:
    """For gradient accumulation: skip DDP's all-reduce on every micro-step but the last (sync=True)."""
    if sync or not isinstance(model, DistributedDataParallel):
        return contextlib.nullcontext()
    return model.no_sync()


class Step:
    """One optimizer step: its micro-batches, and where it sits in the run."""

    def __init__(self, loop: "Steps", it: Iterator[Any], *, number: int, epoch: int, first_micro: int,
                 group_len: int, ends_epoch: bool, is_last: bool, divisor: int | None = None) -> None:
        self._loop, self._it = loop, it
        self._scale: float | None = None  # world / items of the whole step, with micro_batches(count=)
        self.weight: float | None = None  # the current batch's items, with micro_batches(count=)
        self.number = number  # 1-based: the optimizer step this body performs
        self.epoch = epoch  # 0-based
        self.first_micro = first_micro  # this step's first micro-batch within the epoch
        self.group_len = group_len  # micro-batches in this step (the epoch's last group may be short)
        self.divisor = divisor or group_len  # its accumulation group's length (more, after a resume mid-group)
        self.ends_epoch = ends_epoch
        self.is_last = is_last
        self.consumed = 0

    def micro_batches(self, count: Callable[[Any], float] | None = None) -> Iterator[Any]:
        """This step's batches. Gradients are all-reduced only during the last one's backward.

        `count(batch)`: how many items the batch's loss averages over (a language model's label tokens).
        Given it, the step reads all its batches first and sums their items over every rank (one tiny
        all-reduce), so that backward() weighs each batch by its items: the gradient of the mean over every
        item of the global step, however the items fall into batches and ranks (the Trainer's
        average_tokens_across_devices). Without it each micro-batch counts alike, as each rank does."""
        model = self._loop.model
        batches: Iterator[Any] = (self._next(i) for i in range(self.group_len))
        weights: list[float] = []
        if count is not None:
            read = list(batches)
            weights = [float(count(b)) for b in read]
            total = self._loop.sum_over_ranks([sum(weights)])[0]
            self._scale = self._loop.world_size / max(total, 1.0)  # DDP then divides by world_size
            batches = iter(read)
        for i, batch in enumerate(batches):
            self.weight = weights[i] if weights else None
            with no_sync(model, sync=i == self.group_len - 1):
                yield batch

    def _next(self, i: int) -> Any:
        batch = next(self._it, _END)
        if batch is _END:
            raise CoreCPUError(f"the loader ran out after {self.first_micro + i} batches of epoch {self.epoch}, "
                               f"{self._loop.schedule.micro_per_epoch} expected; give run.steps() the loader "
                               "whose batches it counts")
        self.consumed += 1
        return batch

    def backward(self, loss: torch.Tensor) -> None:
        """loss.backward() scaled so that the step averages over all its micro-batches, or, with
        micro_batches(count=), over all its items (`loss` then being the batch's mean over its items)."""
        if self._scale is None:
            (loss / self.divisor).backward()
        else:
            (loss * (self.weight * self._scale)).backward()

    @property
    def epochs(self) -> int:
        return self._loop.schedule.epochs

    @property
    def epochs_done(self) -> float:
        """Epochs done once this step is done, fractional (transformers' `epoch`): 0.5 halfway through the
        first, 1.0 at its end."""
        return self.epoch + (self.first_micro + self.group_len) / self._loop.schedule.micro_per_epoch

    def ends_interval(self, every: int) -> bool:
        """Whether something done every `every` steps is due after this one: every `every`-th step, or with
        `every` 0 each epoch's end; and always the run's last step (e.g. --eval-steps)."""
        return self.is_last or (self.number % every == 0 if every > 0 else self.ends_epoch)

    @property
    def position(self) -> tuple[int, int]:
        """(epoch, micro-batches consumed in it) once this step is done: where a resume starts.
        At an epoch's end that is the start of the next epoch."""
        if self.ends_epoch:
            return self.epoch + 1, 0
        return self.epoch, self.first_micro + self.group_len


class Steps:
    """The steps of a run over `loader`; iterate it after run.wrap(), which knows the resume position."""

    def __init__(self, loader: DataLoader, schedule: Schedule, *, clock: LoopClock,
                 wrapped: Callable[[], Wrapped | None], is_main: bool, world_size: int = 1,
                 sum_over_ranks: Callable[[Sequence[float]], list[float]] = list) -> None:
        """`wrapped()`: wrap()'s result once it exists (None before, or with no wrap() at all).
        `sum_over_ranks`: a collective sum of a few numbers (run.all_reduce_sum), for micro_batches(count=)."""
        self.loader, self.schedule = loader, schedule
        self.world_size, self.sum_over_ranks = world_size, sum_over_ranks
        self._clock, self._wrapped, self._is_main = clock, wrapped, is_main
        self.completed = 0  # optimizer steps done so far (a resumed run starts at its checkpoint's)
        self.model: torch.nn.Module | None = None  # the wrapped model, known when iteration starts

    @property
    def total(self) -> int:
        return self.schedule.total_steps

    def __iter__(self) -> Iterator[Step]:
        sched = self.schedule
        wrapped = self._wrapped()
        self.model = wrapped.model if wrapped else None
        start = wrapped.resumed if wrapped else None
        step, epoch, micro = (start.step, start.epoch, start.batches_in_epoch) if start else (0, 0, 0)
        self.completed = step
        watchdog = self._clock.watchdog()
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
                    self._clock.begin_step(current.number)
                    yield current
                    if current.consumed != n:
                        raise CoreCPUError(f"step {current.number} used {current.consumed} of its {n} micro-batches; "
                                           "iterate step.micro_batches() to the end in every step")
                    step, micro = step + 1, micro + n
                    self.completed = step
                    self._clock.step_done(step)
                    if current.is_last:
                        return
                    self._stop_if_signalled(current, wrapped)
                epoch, micro = epoch + 1, 0
        finally:
            watchdog.stop()

    def _stop_if_signalled(self, step: Step, wrapped: Wrapped | None) -> None:
        """Collective, after `step`: on a stop signal every rank saves (through wrap()'s checkpointer) and exits
        75 with one line; without a checkpointer it exits 128+N, nothing saved."""
        agree = wrapped.agree_max if wrapped is not None else None
        if not preempt.installed() or not (signum := preempt.stop_requested_everywhere(agree)):
            return
        ckpt = wrapped.checkpoints if wrapped else None
        if ckpt is None:
            self._say(f"stopped by {preempt.signal_name(signum)} at step {step.number}; no checkpointer, "
                      "nothing saved (pass checkpoint= to run.wrap())")
            raise SystemExit(128 + signum)
        saved = ckpt.save(step, force=True)
        if self._is_main:
            ckpt.mark_stopped(preempt.signal_name(signum), step.number, saved)
        self._say(preempt.stop_line(signum, step.number, saved.name if saved else f"step-{step.number}"))
        # No rank leaves before rank 0 has recorded the stop and said so: Open MPI's mpirun ends every other rank
        # within a second of the first one's exit.
        _pg.barrier()
        raise SystemExit(preempt.EXIT_STOPPED)

    def _say(self, line: str) -> None:
        if self._is_main:
            print(line, file=sys.stdout, flush=True)
