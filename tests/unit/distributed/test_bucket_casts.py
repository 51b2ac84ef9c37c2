"""Tier 1: which models get their Linear weights' gradients cast into DDP's buckets, and that the patched layers
compute what autocast computes, forward and backward, before any bucket is known (the bucket path itself, with
DDP on 2 ranks: tests/multiprocess/test_bucket_casts.py)."""

from __future__ import annotations

import pytest
import torch

from corecpu.distributed.bucket_casts import install

ON = dict(autocast_bf16=True, wire="fp32", compile=False, use_ipex=False)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, twice: bool = False) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.a(x))
        if twice:
            h = torch.nn.functional.gelu(self.a(h))
        return self.b(h)


def grads(model: Net, twice: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x, twice)
    out.float().square().sum().backward()
    result = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return out.detach(), result


@pytest.mark.parametrize("change, reason", [
    (dict(autocast_bf16=False), "no bf16 autocast"),
    (dict(wire="bf16"), "bf16 on the wire"),
    (dict(compile=True), "torch.compile"),
    (dict(use_ipex=True), "ipex.optimize"),
])
def test_off_where_it_cannot_apply(change, reason):
    choice, owner = install(Net(), **{**ON, **change})
    assert choice.name == "off" and reason in choice.reason and owner is None


def test_only_plain_linears_with_a_weight_of_their_own():
    class Sub(torch.nn.Linear):
        pass

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), Sub(4, 4), torch.nn.Linear(4, 4))
    model[1].weight = model[0].weight  # tied: two modules hold it
    model[3].weight.requires_grad_(False)  # frozen (a LoRA base)
    choice, owner = install(model, **ON)
    assert owner is None and choice.name == "off" and "no plain nn.Linear" in choice.reason
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), Sub(4, 4))
    model[1].weight = model[0].weight
    model.append(torch.nn.Linear(4, 3))
    choice, owner = install(model, **ON)
    assert choice.name == "on" and choice.reason.startswith("1 Linear weights")
    assert "forward" in vars(model[3]) and not any("forward" in vars(model[i]) for i in range(3))
    owner.close()
    assert "forward" not in vars(model[3])


@pytest.mark.parametrize("twice", [False, True])
def test_same_values_and_gradients_as_autocast(twice):
    torch.manual_seed(3)
    plain = Net()
    patched = Net()
    patched.load_state_dict(plain.state_dict())
    choice, owner = install(patched, **ON)
    assert choice.name == "on"
    for _ in range(2):  # the second forward starts a new generation of casts
        (out_a, g_a), (out_b, g_b) = grads(plain, twice), grads(patched, twice)
        assert torch.equal(out_a, out_b)
        assert g_a.keys() == g_b.keys() and all(torch.equal(g_a[n], g_b[n]) for n in g_a)
    assert owner.placed == 0  # no DDP: nothing to place into
    # Outside autocast, or without grad, the layer is the plain one.
    x = torch.randn(2, 16)
    with torch.no_grad():
        assert torch.equal(plain(x), patched(x))
    owner.close()
