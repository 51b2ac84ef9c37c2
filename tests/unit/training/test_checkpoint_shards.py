"""Who writes which part of a checkpoint (corecpu.training.checkpoint_shards): pure planning."""

from __future__ import annotations

import pytest
import torch

from corecpu.training import checkpoint_shards as shards


def test_the_plan_balances_bytes_with_rank_0s_model_counted():
    sizes = {0: 400, 1: 300, 2: 300, 3: 200, 4: 100, 5: 100}
    parts = shards.plan(sizes, 2, head_start=600)
    loads = [sum(sizes[k] for k in part) + (600 if i == 0 else 0) for i, part in enumerate(parts)]
    assert sorted(k for part in parts for k in part) == sorted(sizes)  # every key once
    assert abs(loads[0] - loads[1]) <= 100 and loads == [1000, 1000]


def test_the_plan_is_the_same_whatever_the_key_order_and_one_writer_takes_all():
    sizes = {"b": 5, "a": 5, 3: 7}
    assert shards.plan(sizes, 3, head_start=0) == shards.plan(dict(reversed(sizes.items())), 3, head_start=0)
    assert shards.plan(sizes, 1, head_start=10) == [[3, "a", "b"]]
    with pytest.raises(ValueError):
        shards.plan(sizes, 0, head_start=0)


def test_writers_are_the_ranks_on_rank_0s_host():
    assert shards.writer_ranks(["a", "b", "a", "a", "b"]) == [0, 2, 3]
    assert shards.writer_ranks(["only"]) == [0]


def test_split_then_merge_gives_the_optimizer_state_back():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    state = opt.state_dict()
    sizes = {k: shards.tensor_bytes(v) for k, v in state["state"].items()}
    parts = shards.split(state, shards.plan(sizes, 3, head_start=0))
    assert "param_groups" in parts[0] and all(p.keys() == {"state"} for p in parts[1:])
    assert all(parts[i]["state"] for i in range(3))  # four tensors' states over three writers: none idle
    merged = shards.merge(parts[0], parts[1:])
    assert list(merged["state"]) == list(state["state"]) and merged["param_groups"] == state["param_groups"]
    for k, v in state["state"].items():
        assert all(torch.equal(v[name], merged["state"][k][name]) for name in v)
    fresh = torch.optim.AdamW(model.parameters(), lr=0.1)
    fresh.load_state_dict(merged)  # what resume does with it


def test_tensor_bytes_counts_nested_tensors_only():
    assert shards.tensor_bytes({"a": torch.zeros(3), "b": [torch.zeros(2, dtype=torch.int64), 5, "x"]}) == 28
