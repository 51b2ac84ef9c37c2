"""corecpu.compute.dropout: the fast kernel drops with p's probability, scales without bias, replays from a seed,
and takes over only training-mode, out-of-place F.dropout calls inside the wrapped forward."""

from __future__ import annotations

import pytest
import torch

from corecpu.compute.counter_random import random_int16
from corecpu.compute.dropout import (DropoutChoice, decide_dropout, drop_threshold, dropout_context, fast_dropout,
                                     with_dropout)


def test_threshold_rounds_p_to_1_in_65536_or_declines() -> None:
    assert drop_threshold(0.1) == 6554 and drop_threshold(0.5) == 32768
    for p in (0.0, 1.0, 0.001, 1e-6):  # nothing to draw, or a rounding that would move p by more than 0.1%
        assert drop_threshold(p) is None


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_drops_with_probability_p_in_every_lane_and_keeps_the_mean(p: float) -> None:
    torch.manual_seed(0)
    n = 1 << 20
    out = fast_dropout(torch.ones(n), p)
    dropped = out == 0
    tolerance = 5 * (p * (1 - p) / (n / 2)) ** 0.5  # five sigma of one of the two lanes
    # Each 32-bit hashed word gives two 16-bit lanes: a lane whose bits were not all random would drop at another
    # rate.
    for lane in range(2):
        assert abs(dropped[lane::2].float().mean().item() - p) < tolerance
    rounded = drop_threshold(p) / 65536
    assert torch.all(out[~dropped] == 1 / (1 - rounded))
    assert abs(out.double().mean().item() - 1.0) < 5 * (p / (1 - p) / n) ** 0.5  # unbiased


@pytest.mark.parametrize("p", [0.05, 0.5, 1 - 1 / 65536])
def test_an_element_is_kept_exactly_where_its_16_bits_reach_the_threshold(p: float) -> None:
    """Off by one in the comparison would move p by 1/65536: no rate test sees that, this one does."""
    n = 1 << 17  # hashed, not drawn serially
    torch.manual_seed(3)
    values = random_int16(n).int() + 32768  # the same draw fast_dropout makes, as 0..65535
    torch.manual_seed(3)
    out = fast_dropout(torch.ones(n), p)
    dropped = drop_threshold(p)
    assert torch.equal(out != 0, values >= dropped)
    assert (values == dropped).any() and (values == dropped - 1).any()  # both sides of the boundary are checked


def test_backward_multiplies_by_the_same_mask_and_dtype_and_strides_are_kept() -> None:
    torch.manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(8, 6, dtype=dtype).t().requires_grad_()  # not contiguous
        out = fast_dropout(x, 0.3)
        assert out.dtype == dtype and out.shape == x.shape
        out.sum().backward()
        mask = out.detach() / x.detach()
        assert torch.equal(x.grad != 0, out != 0)
        torch.testing.assert_close(x.grad[out != 0], mask[out != 0])


def test_a_seed_replays_the_stream() -> None:
    x = torch.randn(1000)
    torch.manual_seed(7)
    first, after = fast_dropout(x, 0.1), torch.rand(1)
    torch.manual_seed(7)
    assert torch.equal(fast_dropout(x, 0.1), first) and torch.equal(torch.rand(1), after)


class _Block(torch.nn.Module):
    """Both ways models call dropout: an nn.Dropout module, and F.dropout (Hugging Face's eager attention)."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(self.drop(x), p=0.1, training=self.training)


def test_the_wrapped_forward_uses_the_fast_kernel_and_nothing_else_changes() -> None:
    block, x = _Block().train(), torch.ones(4096)
    forward = block.forward
    block.forward = with_dropout(block.forward, DropoutChoice("fast", "test"))
    torch.manual_seed(3)
    wrapped = block(x)
    torch.manual_seed(3)
    assert torch.equal(wrapped, fast_dropout(fast_dropout(x, 0.1), 0.1))
    torch.manual_seed(3)
    assert not torch.equal(wrapped, forward(x))  # outside the wrapper: torch's kernel, another stream
    assert torch.equal(block.eval()(x), x)  # evaluation: no dropout at all
    assert with_dropout(forward, DropoutChoice("torch", "requested")) is forward
    torch.manual_seed(4)
    reference = _in_place_dropout(x, 0.2)  # torch's
    with dropout_context("fast"):  # in-place calls and p=0 stay torch's
        torch.manual_seed(4)
        assert torch.equal(_in_place_dropout(x, 0.2), reference)
        assert torch.equal(torch.nn.functional.dropout(x, 0.0, True), x)


def _in_place_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    y = x.clone()
    torch.nn.functional.dropout(y, p, True, True)
    return y


def test_compile_keeps_torchs_kernel_and_torch_is_asked_for_by_name() -> None:
    assert decide_dropout("fast", compile=False).name == "fast"
    assert decide_dropout("fast", compile=True).name == "torch"
    assert decide_dropout("torch", compile=False) == DropoutChoice("torch", "requested")


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_checkpointed_forward_gets_the_gradient_its_recomputation_gives(reentrant: bool) -> None:
    # torch.utils.checkpoint recomputes the forward in the backward, outside the wrapped forward: with the fast kernel
    # in the first pass and torch's in the second, the masks would differ and the gradient would be wrong, silently.
    from torch.utils.checkpoint import checkpoint

    linear = torch.nn.Linear(8, 8)
    x = torch.randn(64, 8, requires_grad=True)

    def block(inputs: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(linear(inputs), 0.5, True) * 3

    def run(kernel: str, checkpointed: bool) -> tuple[torch.Tensor, torch.Tensor]:
        linear.weight.grad = None
        torch.manual_seed(0)
        with dropout_context(kernel):
            out = checkpoint(block, x, use_reentrant=reentrant) if checkpointed else block(x)
        out.sum().backward()
        return out.detach(), linear.weight.grad.clone()

    out, grad = run("fast", checkpointed=True)
    # The pair must be one kernel's forward and that same kernel's gradient.
    pairs = [run(kernel, checkpointed=False) for kernel in ("fast", "torch")]
    assert any(torch.equal(out, ref_out) and torch.allclose(grad, ref_grad) for ref_out, ref_grad in pairs)


def test_a_model_with_gradient_checkpointing_keeps_torchs_kernel() -> None:
    from transformers import BertConfig, BertModel

    from corecpu.compute.dropout import uses_gradient_checkpointing

    model = BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=32))
    assert not uses_gradient_checkpointing(model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert uses_gradient_checkpointing(model)
    assert decide_dropout("fast", compile=False, checkpointing=True).name == "torch"


def test_a_model_without_dropout_is_left_alone() -> None:
    from transformers import BertConfig, BertModel, LlamaConfig, LlamaForCausalLM

    from corecpu.compute.dropout import has_dropout

    small = dict(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    assert has_dropout(BertModel(BertConfig(**small)))
    # Attention dropout alone is functional (no nn.Dropout holds it): the config says so.
    assert has_dropout(BertModel(BertConfig(**small, hidden_dropout_prob=0.0)))
    assert not has_dropout(BertModel(BertConfig(**small, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)))
    assert not has_dropout(LlamaForCausalLM(LlamaConfig(**small, num_key_value_heads=2)))  # attention_dropout 0.0
    assert decide_dropout("fast", compile=False, dropout=False).name == "torch"


def test_only_the_thread_inside_the_context_gets_the_fast_kernel_and_torchs_name_comes_back() -> None:
    import threading

    torch_dropout = torch.nn.functional.dropout
    x = torch.ones(4096)
    seen: dict[str, torch.Tensor] = {}
    entered, done = threading.Event(), threading.Event()

    def other_thread() -> None:  # runs while the main thread is inside the context
        entered.wait(10)
        torch.manual_seed(5)
        seen["other"] = torch.nn.functional.dropout(x, 0.1, True)
        done.set()

    worker = threading.Thread(target=other_thread)
    worker.start()
    with dropout_context("fast"):
        with dropout_context("fast"):  # nested: still fast, and leaving the inner one keeps it so
            pass
        entered.set()
        assert done.wait(10)
        torch.manual_seed(5)
        inside = torch.nn.functional.dropout(x, 0.1, True)
    worker.join()
    torch.manual_seed(5)
    assert torch.equal(inside, fast_dropout(x, 0.1))
    torch.manual_seed(5)
    assert torch.equal(seen["other"], torch_dropout(x, 0.1, True))  # torch's kernel, its stream
    assert torch.nn.functional.dropout is torch_dropout  # the name is torch's own again
