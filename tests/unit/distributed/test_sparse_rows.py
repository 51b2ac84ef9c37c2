"""The pure parts of the sparse word-embedding all-reduce: which rows, their union, where it applies
(2 ranks through DDP: tests/multiprocess/test_sparse_rows.py)."""

from __future__ import annotations

import pytest
import torch

from corecpu.distributed.sparse_rows import MIN_ROWS, decide, embedding_weight, touched_rows, union_rows
from corecpu.errors import CoreCPUError


class Toy(torch.nn.Module):
    """A word embedding, a head, and get_input_embeddings() as transformers' models have it."""

    def __init__(self, rows: int = MIN_ROWS, tied: bool = False, sparse: bool = False) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(rows, 4, sparse=sparse)
        self.head = torch.nn.Linear(4, rows, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.embed


def test_touched_rows_are_the_rows_with_any_nonzero():
    grad = torch.zeros(6, 3)
    grad[1, 2] = 1e-30
    grad[4] = float("nan")  # a NaN must travel, so that every rank sees it
    grad[3, 0] = -0.0  # a signed zero is no contribution
    assert touched_rows(grad).tolist() == [1, 4]
    assert touched_rows(torch.zeros(5, 2)).tolist() == []


def test_union_is_sorted_unique_over_ranks():
    parts = [torch.tensor([9, 2, 5]), torch.tensor([5, 7]), torch.tensor([], dtype=torch.int64), torch.tensor([2])]
    union = union_rows(parts)
    assert union.tolist() == [2, 5, 7, 9] and union.dtype == torch.int64
    assert union_rows([torch.tensor([], dtype=torch.int64)] * 2).tolist() == []
    assert union_rows([]).tolist() == []


def test_auto_applies_to_a_large_trainable_untied_embedding():
    model = Toy()
    choice, weight = decide("auto", model)
    assert weight is model.embed.weight
    assert choice.name == "on" and f"word embedding {MIN_ROWS} x 4" in str(choice)


@pytest.mark.parametrize("make, why", [
    (lambda: Toy(tied=True), "tied to head.weight"),
    (lambda: Toy(sparse=True), "sparse=True"),
    (lambda: torch.nn.Linear(3, 3), "names no input word embedding"),
])
def test_where_it_cannot_apply_auto_skips_and_on_refuses(make, why):
    choice, weight = decide("auto", make())
    assert weight is None and choice.name == "off" and why in choice.reason
    with pytest.raises(CoreCPUError, match=f"sparse_embedding_allreduce is on but .*{why}.*; use auto or off"):
        decide("on", make())


def test_a_frozen_embedding_or_an_embedding_alone_has_nothing_to_reduce():
    frozen = Toy()
    frozen.embed.weight.requires_grad_(False)
    assert embedding_weight(frozen)[1] == "the input embedding is frozen: no gradient to reduce"
    alone = Toy()
    alone.head.weight.requires_grad_(False)
    assert embedding_weight(alone)[0] is None  # DDP would refuse a model with nothing else to reduce


def test_small_vocabularies_stay_in_ddp_under_auto_but_on_takes_them():
    choice, weight = decide("auto", Toy(rows=MIN_ROWS - 1))
    assert weight is None and f"under {MIN_ROWS} rows" in choice.reason
    choice, weight = decide("on", Toy(rows=100))
    assert weight is not None and choice.name == "on" and "(requested)" in choice.reason


def test_off_and_bad_values():
    assert decide("off", Toy())[0].name == "off"
    with pytest.raises(CoreCPUError, match="sparse_embedding_allreduce must be one of auto, on, off, got 'yes'"):
        decide("yes", Toy())
