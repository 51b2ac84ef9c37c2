"""Which examples each rank trains and evaluates on, in which order, and the loaders around that.

Every training sampler gives each rank ceil(N / world) indices per epoch (duplicates pad
the last ones, as DistributedSampler does), so ranks take the same number of steps.
Resume mid-epoch with `set_epoch(loader, epoch, skip_batches=k)`: it slices the
sampler's index list, so skipped batches are never tokenized, collated or loaded.

Length grouping (`group_by_length=True`) follows Hugging Face's LengthGroupedSampler
(shuffle, cut into mega-batches, sort each by length) but sorts for the *global* batch:
the ranks of one step get neighbouring slices of one sorted run, so they pad to similar
widths and none waits long for another's longer batch.
"""

from __future__ import annotations

import math
from typing import Iterator, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from corecpu.data.tokenized import TokenizedDataset, make_collate, padded_width
from corecpu.errors import CoreCPUError

# Hugging Face caps mega-batches at 50 batches and keeps at least 4 of them per epoch
# (trainer_pt_utils.get_length_grouped_indices). Larger mega-batches group lengths more
# tightly; fewer of them make batch composition repeat across epochs. On the paraphrase
# task (3000 examples, 2 ranks x 16) this gives 23 global batches per mega-batch.
MAX_MEGABATCH_MULT = 50
MIN_MEGABATCHES = 4


def megabatch_mult(num_indices: int, global_batch: int) -> int:
    """Global batches per mega-batch."""
    return max(1, min(MAX_MEGABATCH_MULT, num_indices // (MIN_MEGABATCHES * global_batch)))


def grouped_global_batches(lengths: Sequence[int], batch_size: int, world_size: int, seed: int, epoch: int,
                           shuffle: bool = True) -> list[list[int]]:
    """One epoch's global batches (batch_size x world_size indices each; only the last may be
    shorter, and its size is a multiple of world_size). Deterministic for (seed, epoch)."""
    n = len(lengths)
    g = torch.Generator()
    g.manual_seed(seed + epoch)  # the same stream DistributedSampler draws from
    order = torch.randperm(n, generator=g).tolist() if shuffle else list(range(n))
    total = math.ceil(n / world_size) * world_size
    while len(order) < total:  # pad with duplicates, as DistributedSampler does
        order += order[: total - len(order)]
    glob = batch_size * world_size
    mega = glob * megabatch_mult(total, glob)
    ranked: list[int] = []
    for start in range(0, total, mega):
        # Longest first; sorted() is stable, so equal lengths keep their shuffled order.
        ranked += sorted(order[start:start + mega], key=lambda i: -lengths[i])
    batches = [ranked[i:i + glob] for i in range(0, total, glob)]
    full = batches if len(batches[-1]) == glob else batches[:-1]
    if shuffle:
        full = [full[i] for i in torch.randperm(len(full), generator=g).tolist()]
    # The short batch stays last: each rank's loader cuts its index stream every batch_size items.
    return full + batches[len(full):]


def rank_slice(global_batches: list[list[int]], rank: int, world_size: int) -> list[int]:
    """Rank r's indices: the r-th of world_size equal slices of every global batch."""
    out: list[int] = []
    for batch in global_batches:
        per = len(batch) // world_size
        out += batch[rank * per:(rank + 1) * per]
    return out


def padding_fraction(lengths: Sequence[int], batches: Sequence[Sequence[int]], pad_to_multiple_of: int = 0,
                     max_len: int | None = None) -> float:
    """Pad positions / all positions when each batch pads to its own width (as make_collate does)."""
    real = padded = 0
    for batch in batches:
        ls = [lengths[i] for i in batch]
        real += sum(ls)
        padded += padded_width(max(ls), pad_to_multiple_of, max_len) * len(ls)
    return (padded - real) / padded if padded else 0.0


class ResumableDistributedSampler(DistributedSampler):
    """DistributedSampler (pads with duplicates so ranks take equal steps) that can skip
    the first k batches of an epoch by slicing its index list."""

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, shuffle: bool, seed: int,
                 batch_size: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=False)
        self.batch_size = batch_size
        self.skip = 0

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        super().set_epoch(epoch)
        self.skip = min(skip_batches * self.batch_size, self.num_samples)

    def _indices(self) -> list:
        return list(super().__iter__())

    def __iter__(self) -> Iterator[int]:
        return iter(self._indices()[self.skip:])

    def __len__(self) -> int:
        return self.num_samples - self.skip


class LengthGroupedDistributedSampler(ResumableDistributedSampler):
    """Rank `rank`'s slice of `grouped_global_batches`: same count per rank as the plain sampler."""

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, shuffle: bool, seed: int, batch_size: int,
                 lengths: Sequence[int]) -> None:
        super().__init__(dataset, num_replicas, rank, shuffle, seed, batch_size)
        self.lengths = list(lengths)

    def _indices(self) -> list:
        batches = grouped_global_batches(self.lengths, self.batch_size, self.num_replicas, self.seed, self.epoch,
                                         self.shuffle)
        return rank_slice(batches, self.rank, self.num_replicas)


class EvalShardSampler(ResumableDistributedSampler):
    """Each rank gets its true strided shard, padded with (index, valid=False) fillers to
    ceil(N / world) items so every rank runs the same number of batches. With `lengths` the shard
    runs longest first, so each batch pads to a width close to its examples' own (padding in
    evaluation is pure waste); fillers stay last. Metrics are sums, and QA puts its logits back in
    feature order, so the order changes no score."""

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, shuffle: bool, seed: int, batch_size: int,
                 lengths: Sequence[int] | None = None) -> None:
        super().__init__(dataset, num_replicas, rank, shuffle, seed, batch_size)
        self.lengths = None if lengths is None else list(lengths)

    def _indices(self) -> list:
        n = len(self.dataset)  # type: ignore[arg-type]
        shard = list(range(self.rank, n, self.num_replicas))
        if self.lengths is not None:
            lengths = self.lengths
            shard.sort(key=lambda i: -lengths[i])  # stable: equal lengths keep their data order
        real = [(i, True) for i in shard]
        return real + [(i % n, False) for i in range(self.num_samples - len(real))]


def _check(batch_size: int, rank: int, world_size: int) -> None:
    if batch_size < 1:
        raise CoreCPUError(f"batch size must be at least 1, got {batch_size}; pass a positive --batch-size")
    if not 0 <= rank < world_size:
        raise CoreCPUError(f"rank {rank} is outside world size {world_size}; check the launcher's environment")


def train_sampler(dataset: Dataset, batch_size: int, rank: int, world_size: int, seed: int = 0,
                  shuffle: bool = True, lengths: Sequence[int] | None = None) -> ResumableDistributedSampler:
    """The training sampler for any map-style dataset: length-grouped when `lengths` are given."""
    _check(batch_size, rank, world_size)
    if lengths is not None:
        return LengthGroupedDistributedSampler(dataset, world_size, rank, shuffle, seed, batch_size, lengths)
    return ResumableDistributedSampler(dataset, world_size, rank, shuffle, seed, batch_size)


def build_loader(dataset: TokenizedDataset, batch_size: int, rank: int, world_size: int, seed: int = 0,
                 shuffle: bool = True, drop_last: bool = False, num_workers: int = 0, group_by_length: bool = False,
                 pad_to_multiple_of: int = 0) -> DataLoader:
    """Training loader: per-rank batch_size; every rank gets ceil(N / world) samples.
    drop_last drops each rank's short final batch. group_by_length: see the module docstring.
    pad_to_multiple_of rounds batch widths up (capped at the dataset's max_seq_len).
    num_workers defaults to 0: data is pre-tokenized and workers would steal compute cores."""
    sampler = train_sampler(dataset, batch_size, rank, world_size, seed, shuffle,
                            dataset.lengths if group_by_length else None)
    collate = make_collate(dataset.tokenizer, pad_to_multiple_of, dataset.max_seq_len)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last, collate_fn=collate,
                      num_workers=num_workers)


def build_eval_loader(dataset: TokenizedDataset, batch_size: int, rank: int, world_size: int,
                      num_workers: int = 0, pad_to_multiple_of: int = 0) -> DataLoader:
    """Eval loader: no shuffling, no duplicates. Sum metrics weighted by batch['valid'] and
    all-reduce the sums: each example is counted exactly once across ranks."""
    _check(batch_size, rank, world_size)
    sampler = EvalShardSampler(dataset, world_size, rank, False, 0, batch_size)
    collate = make_collate(dataset.tokenizer, pad_to_multiple_of, dataset.max_seq_len)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate, num_workers=num_workers)


def set_epoch(loader: DataLoader, epoch: int, skip_batches: int = 0) -> None:
    """Call before each epoch. skip_batches (resume only) applies to this epoch alone;
    the next set_epoch resets it. Batches after the skip are identical to an unskipped run."""
    loader.sampler.set_epoch(epoch, skip_batches)  # type: ignore[union-attr]


def steps_per_epoch(num_examples: int, batch_size: int, world_size: int, drop_last: bool = False) -> int:
    """Optimizer steps per epoch on every rank (before gradient accumulation)."""
    per_rank = math.ceil(num_examples / world_size)
    return per_rank // batch_size if drop_last else math.ceil(per_rank / batch_size)
