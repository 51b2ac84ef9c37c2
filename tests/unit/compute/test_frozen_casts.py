"""corecpu.compute.frozen_casts: a LoRA run's frozen Linear weights cast to bf16 once give the losses, gradients and
evaluations of autocast's cast in every forward, bit for bit; a written weight is cast again; fp32 calls, trainable
weights keep their own path; peft's merges are seen; the copies are made only where they fit."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from corecpu.compute import frozen_casts
from corecpu.compute.frozen_casts import candidates, fits, install

BF16 = torch.bfloat16


def _roomy(ranks: int) -> tuple[int | None, int | None]:
    return None, 1 << 40


def _lora_model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    model.config.use_cache = False
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0,
                                            init_lora_weights=False))  # nonzero B: the adapters change the output


def _batch(step: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(1, 96, (3, 12), generator=torch.Generator().manual_seed(step))
    return {"input_ids": ids, "labels": ids}


def _train(model: torch.nn.Module, steps: int = 3) -> tuple[list[float], list[float], dict[str, torch.Tensor]]:
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses, evals = [], []
    for step in range(steps):
        with torch.autocast("cpu", dtype=BF16):
            loss = model(**_batch(step)).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        with torch.no_grad(), torch.autocast("cpu", dtype=BF16):
            evals.append(model(**_batch(100)).loss.item())
    return losses, evals, {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def test_lora_training_and_evaluation_match_autocast_bit_for_bit() -> None:
    plain, cached = _lora_model(), _lora_model()
    choice = install(cached, BF16, compile=False, use_ipex=False, local_ranks=2, budget=_roomy)
    # 2 layers x 7 projections, and the LM head that shares the input embedding
    assert choice.name == "bf16" and "15 frozen Linear weights" in choice.reason
    head = cached.get_base_model().lm_head
    assert "forward" in vars(head) and head.weight is cached.get_base_model().model.embed_tokens.weight
    a, b = _train(plain), _train(cached)
    assert a[0] == b[0] and a[1] == b[1]  # every step's loss and every evaluation, exactly
    assert a[0][0] != a[0][-1]  # the adapters trained
    assert a[2].keys() == b[2].keys() and all(torch.equal(a[2][k], b[2][k]) for k in a[2])


def _outputs(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad(), torch.autocast("cpu", dtype=BF16):
        return model(**_batch(200)).logits


def test_peft_merging_and_unmerging_the_adapters_is_seen() -> None:
    """peft writes merges through `.data`: a copy kept across one would drop the adapters from the output."""
    plain, cached = _lora_model(), _lora_model()
    install(cached, BF16, compile=False, use_ipex=False, local_ranks=1, budget=_roomy)
    _train(plain), _train(cached)
    unmerged = _outputs(cached)
    assert torch.equal(unmerged, _outputs(plain))
    for model in (plain, cached):
        model.merge_adapter()
    merged = _outputs(cached)
    assert torch.equal(merged, _outputs(plain)) and not torch.equal(merged, unmerged)
    for model in (plain, cached):
        model.unmerge_adapter()
    assert torch.equal(_outputs(cached), _outputs(plain))
    unloaded = [model.merge_and_unload() for model in (plain, cached)]
    assert torch.equal(_outputs(unloaded[1]), _outputs(unloaded[0]))


def test_a_weight_put_in_place_of_the_old_one_is_used() -> None:
    layer, x = _linear(), torch.randn(4, 16)
    install(layer, BF16, compile=False, use_ipex=False, local_ranks=1, budget=_roomy)
    with torch.autocast("cpu", dtype=BF16):
        layer(x)
    layer.weight = torch.nn.Parameter(layer.weight.detach() * 3, requires_grad=False)
    with torch.autocast("cpu", dtype=BF16):
        assert torch.equal(layer(x), _autocast(layer, x))


def _linear() -> torch.nn.Linear:
    torch.manual_seed(1)
    layer = torch.nn.Linear(16, 8).requires_grad_(False)
    layer.bias.requires_grad_(True)
    return layer


def _autocast(layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", dtype=BF16):
        return torch.nn.functional.linear(x, layer.weight, layer.bias)


def test_the_kept_copy_is_what_the_forward_multiplies_by() -> None:
    layer, x = _linear(), torch.randn(4, 16)
    install(layer, BF16, compile=False, use_ipex=False, local_ranks=1, budget=_roomy)
    with torch.autocast("cpu", dtype=BF16):
        first = layer(x)
    assert torch.equal(first, _autocast(layer, x))
    layer.weight.data.mul_(3)  # .data bypasses the version counter: only a kept copy still gives the old output
    with torch.autocast("cpu", dtype=BF16):
        assert torch.equal(layer(x), first)


def test_a_weight_written_through_the_parameter_is_cast_again() -> None:
    layer, x = _linear(), torch.randn(4, 16)
    install(layer, BF16, compile=False, use_ipex=False, local_ranks=1, budget=_roomy)
    with torch.autocast("cpu", dtype=BF16):
        layer(x)
    with torch.no_grad():
        layer.weight.mul_(3)
    with torch.autocast("cpu", dtype=BF16):
        again = layer(x)
    assert torch.equal(again, _autocast(layer, x)) and not torch.equal(again, _autocast(_linear(), x))
    layer.load_state_dict({k: v * 0.5 for k, v in layer.state_dict().items()})
    with torch.autocast("cpu", dtype=BF16):
        assert torch.equal(layer(x), _autocast(layer, x))


def test_fp32_calls_and_a_weight_trained_again_take_the_fp32_weight() -> None:
    layer, x = _linear(), torch.randn(4, 16)
    install(layer, BF16, compile=False, use_ipex=False, local_ranks=1, budget=_roomy)
    with torch.autocast("cpu", dtype=BF16):
        layer(x)
    out = layer(x)  # no autocast: fp32 throughout, as before
    assert out.dtype == torch.float32 and torch.equal(out, torch.nn.functional.linear(x, layer.weight, layer.bias))
    layer.weight.requires_grad_(True)
    with torch.autocast("cpu", dtype=BF16):
        layer(x).sum().backward()
    assert layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0


def test_which_layers_and_when() -> None:
    model = _lora_model()
    base = model.get_base_model()
    chosen = candidates(model)
    assert base.lm_head in chosen and len(chosen) == 15  # the head tied to the input embedding too
    assert all(not m.weight.requires_grad for m in chosen)
    trained = torch.nn.Linear(4, 4)
    assert candidates(trained) == []
    for kwargs, reason in (({"dtype": None}, "no autocast"), ({"compile": True}, "torch.compile"),
                           ({"use_ipex": True}, "ipex")):
        args = {"dtype": BF16, "compile": False, "use_ipex": False, **kwargs}
        choice = install(model, args.pop("dtype"), local_ranks=1, budget=_roomy, **args)
        assert choice.name == "off" and reason in choice.reason
    assert install(trained, BF16, compile=False, use_ipex=False, local_ranks=1,
                   budget=_roomy).reason == "no frozen Linear weights"
    tight = install(model, BF16, compile=False, use_ipex=False, local_ranks=4, budget=lambda n: (None, 10_000))
    assert tight.name == "off" and "memory available" in tight.reason
    assert all("forward" not in vars(m) for m in chosen)  # nothing was patched by the refusals


@pytest.mark.parametrize("copy_bytes, ranks, limit, available, expected", [
    (100, 2, None, None, True),  # nothing known: the copies are made
    (100, 2, None, 400, True),
    (100, 2, None, 399, False),
    (100, 4, 10_000, 800, True),
    (100, 4, 700, 10_000, False),  # the tighter of the cgroup and the host
])
def test_fits(copy_bytes: int, ranks: int, limit: int | None, available: int | None, expected: bool) -> None:
    assert fits(copy_bytes, ranks, limit, available) is expected
    assert frozen_casts.FIT_SHARE == 0.5


def test_installing_twice_patches_nothing_more() -> None:
    model = _lora_model()
    assert install(model, BF16, compile=False, use_ipex=False, local_ranks=1, budget=_roomy).name == "bf16"
    assert candidates(model) == []
    assert install(model, BF16, compile=False, use_ipex=False, local_ranks=1,
                   budget=_roomy).reason == "no frozen Linear weights"


class _HostShare:
    """A stand-in for corecpu.distributed.host_copy in one process: a buffer filled as the host's first rank would."""

    def __init__(self, give: bool = True) -> None:
        self.give, self.asked, self.buffer = give, [], None

    def __call__(self, numel: int, dtype: torch.dtype, fill, ok: bool) -> torch.Tensor | None:
        self.asked.append(ok)
        if not (self.give and ok):
            return None
        self.buffer = torch.full((numel,), float("nan"), dtype=dtype)
        fill(self.buffer)
        return self.buffer


def test_a_host_shared_copy_trains_bit_for_bit_and_is_what_the_forward_reads() -> None:
    plain, shared = _lora_model(), _lora_model()
    share = _HostShare()
    choice = install(shared, BF16, compile=False, use_ipex=False, local_ranks=2, budget=_roomy, share=share)
    assert share.asked == [True] and "one copy in /dev/shm for the host's 2 ranks" in choice.reason
    assert not share.buffer.isnan().any()  # every weight's slice was filled
    a, b = _train(plain), _train(shared)
    assert a[0] == b[0] and a[1] == b[1] and all(torch.equal(a[2][k], b[2][k]) for k in a[2])
    before = _outputs(shared)
    share.buffer.mul_(0.5)  # the forward multiplies by the host's copy, not by a private one
    assert not torch.equal(_outputs(shared), before)


def test_a_weight_written_after_sharing_gets_a_private_copy_and_the_shared_one_is_left() -> None:
    layer, x = _linear(), torch.randn(4, 16)
    share = _HostShare()
    install(layer, BF16, compile=False, use_ipex=False, local_ranks=4, budget=_roomy, share=share)
    kept = share.buffer.clone()
    with torch.no_grad():
        layer.weight.mul_(3)
    with torch.autocast("cpu", dtype=BF16):
        assert torch.equal(layer(x), _autocast(layer, x))
    assert torch.equal(share.buffer, kept)  # the other ranks still read the weight as it was on their side


def test_without_a_shared_copy_each_rank_keeps_its_own_where_they_fit() -> None:
    model, share = _lora_model(), _HostShare(give=False)
    assert "a copy a rank" in install(model, BF16, compile=False, use_ipex=False, local_ranks=2, budget=_roomy,
                                      share=share).reason
    one = sum(m.weight.numel() for m in candidates(_lora_model())) * 2
    # Room for one copy, not for two: the host's rank may share (ok), and without sharing nothing is patched.
    tight, share = _lora_model(), _HostShare(give=False)
    choice = install(tight, BF16, compile=False, use_ipex=False, local_ranks=2, budget=lambda n: (None, 3 * one),
                     share=share)
    assert share.asked == [True] and choice.name == "off"
    shared, share = _lora_model(), _HostShare()
    assert install(shared, BF16, compile=False, use_ipex=False, local_ranks=2, budget=lambda n: (None, 3 * one),
                   share=share).name == "bf16"
