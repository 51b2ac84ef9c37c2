"""Bookkeeping of a training loop that is not the loop itself.

`Schedule` is pure arithmetic: how many micro-batches an epoch has, which of them
end an accumulation group, how many optimizer steps the run takes, where a
resumed run starts. `StepStats` sums loss, samples and tokens between log steps
on each rank and reduces them across ranks only when a line is logged (the
reduction syncs the host, so it must not happen every step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch.utils.data import DataLoader

from corecpu.errors import CoreCPUError


@dataclass(frozen=True)
class Schedule:
    micro_per_epoch: int  # micro-batches per epoch on every rank
    grad_accum: int
    epochs: int
    max_steps: int = 0  # 0: all epochs

    def __post_init__(self) -> None:
        if self.micro_per_epoch < 1:
            raise CoreCPUError("the training data gives no batch; check the data file and the batch size")
        if self.grad_accum < 1 or self.epochs < 1 or self.max_steps < 0:
            raise CoreCPUError(f"bad schedule: grad_accum {self.grad_accum}, epochs {self.epochs}, "
                               f"max_steps {self.max_steps}; use positive numbers")
        if self.grad_accum > self.micro_per_epoch:
            # One short step per epoch, and a global batch that is not what it says: refuse instead.
            raise CoreCPUError(f"grad_accum {self.grad_accum} is more than the {self.micro_per_epoch} batches an epoch "
                               f"gives each rank; use --grad-accum {self.micro_per_epoch} or less, or a smaller "
                               "--batch-size")

    @classmethod
    def for_data(cls, num_examples: int, batch_size: int, world_size: int, grad_accum: int, epochs: int,
                 max_steps: int = 0) -> "Schedule":
        # The sampler pads every rank to ceil(N / world) examples, so all ranks take the same steps.
        micro = math.ceil(math.ceil(num_examples / world_size) / batch_size)
        return cls(micro, grad_accum, epochs, max_steps)

    @classmethod
    def for_loader(cls, loader: DataLoader, grad_accum: int = 1, epochs: int = 1, max_steps: int = 0) -> "Schedule":
        """From the batches one epoch of `loader` gives on this rank (every rank the same, with run.loader())."""
        per_rank = getattr(loader.sampler, "num_samples", None)  # DistributedSampler and corecpu's samplers
        if per_rank is None or loader.batch_size is None:
            return cls(len(loader), grad_accum, epochs, max_steps)
        micro = per_rank // loader.batch_size if loader.drop_last else math.ceil(per_rank / loader.batch_size)
        return cls(micro, grad_accum, epochs, max_steps)

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.micro_per_epoch / self.grad_accum)

    @property
    def total_steps(self) -> int:
        total = self.steps_per_epoch * self.epochs
        return min(total, self.max_steps) if self.max_steps else total

    def group_len(self, micro: int) -> int:
        """Micro-batches in the accumulation group of `micro`: the epoch's last group may be short,
        and its loss must be divided by its true length so every step averages the same way."""
        start = micro - micro % self.grad_accum
        return min(self.grad_accum, self.micro_per_epoch - start)

    def ends_group(self, micro: int) -> bool:
        """Whether micro-batch `micro` (0-based within the epoch) is the last of its group: sync and step."""
        start = micro - micro % self.grad_accum
        return micro + 1 == start + self.group_len(micro)

    def epoch_done(self, batches_in_epoch: int) -> bool:
        return batches_in_epoch >= self.micro_per_epoch

    def finished(self, step: int, epoch: int) -> bool:
        return step >= self.total_steps or epoch >= self.epochs


class StepStats:
    """Per-rank sums since the last log record; `reduce` all-reduces them and starts over."""

    def __init__(self) -> None:
        self.loss_sum = torch.zeros((), dtype=torch.float64)  # stays a tensor: no host sync per step
        self.samples = self.tokens = self.padded = 0
        self.weight = 0.0  # what the loss is averaged over: samples, or the items `add` is given
        self.flops = 0.0  # the model FLOPs of the micro-batches (corecpu.compute.flops): for MFU

    def add(self, loss: torch.Tensor, samples: int, tokens: int, padded: int = 0, weight: float | None = None,
            flops: float = 0.0) -> None:
        """`weight`: the items `loss` is the mean over (a language model's label tokens); default: samples."""
        weight = samples if weight is None else weight
        self.loss_sum += loss.detach().double() * weight
        self.weight += weight
        self.samples += samples
        self.tokens += tokens
        self.padded += padded
        self.flops += flops

    def reduce(self, all_reduce_sum: Callable[[Sequence[float]], list[float]], *, rank: int = 0, world_size: int = 1,
               rank_values: Sequence[float] = ()) -> dict[str, Any]:
        """Global mean loss and totals since the last call (a collective: every rank calls it). `rank_values`
        (this rank's peak RSS, say) come back as "per_rank": for each, every rank's, in the same all-reduce."""
        width = len(rank_values)
        slots = [0.0] * (world_size * width)
        slots[rank * width:(rank + 1) * width] = rank_values
        loss, weight, samples, tokens, padded, flops, *gathered = all_reduce_sum(
            [self.loss_sum.item(), self.weight, self.samples, self.tokens, self.padded, self.flops, *slots])
        self.__init__()
        per_rank = [[gathered[r * width + i] for r in range(world_size)] for i in range(width)]
        return {"loss": loss / max(weight, 1e-12), "samples": samples, "tokens": tokens,
                "padding": padded / max(tokens + padded, 1), "flops": flops, "per_rank": per_rank}
