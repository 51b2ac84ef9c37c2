"""corecpu.compute.attention: sdpa or eager attention, decided by timing an attention layer (or the model), cached."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import (BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel, ResNetConfig,
                          ResNetForImageClassification)

from corecpu.compute import attention_mask
from corecpu.compute.attention import (LAYER_MIN_ROUNDS, MARGIN, SCORES_SHARE, AttentionChoice, TooLongToTime,
                                       agree_attention, agreed_ratio, attention_layer, decide_attention,
                                       eager_scores_bytes, generates, measure_layer_sdpa_over_eager,
                                       measure_sdpa_over_eager, remember_attention, resolve_attention, scores_room,
                                       switchable)
from corecpu.cpu.hardware import read_cpu_features
from corecpu.errors import CoreCPUError


def tiny_bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=500, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, attn_implementation="sdpa")
    return BertForSequenceClassification(config)


def test_eager_only_where_it_was_measured_faster_by_the_margin() -> None:
    assert decide_attention("auto", "sdpa", MARGIN + 0.01).name == "eager"
    assert decide_attention("auto", "sdpa", MARGIN - 0.01).name == "sdpa"  # within noise: the library's default
    assert decide_attention("auto", "sdpa", 0.8).name == "sdpa"
    cached = decide_attention("auto", "sdpa", 1.2, cached=True)
    assert cached.source == "cached" and "cached" in cached.reason and cached.sdpa_over_eager == 1.2
    assert decide_attention("eager", "sdpa").name == "eager" and decide_attention("sdpa", "eager").name == "sdpa"
    assert decide_attention("auto", None).name == "unchanged"  # no switch (an image model, flash attention)
    with pytest.raises(CoreCPUError, match="no sdpa/eager attention"):
        decide_attention("eager", None)
    with pytest.raises(CoreCPUError, match="attention must be one of"):
        decide_attention("flash", "sdpa")


def test_ranks_agree_on_eager_only_when_every_rank_measured_it() -> None:
    eager, sdpa = AttentionChoice("eager", "fast", 1.1, "measured"), AttentionChoice("sdpa", "slow", 1.0, "measured")
    assert agree_attention([eager, eager]) is eager
    assert agree_attention([eager, sdpa]) is sdpa and agree_attention([sdpa, eager]) is sdpa


def test_timing_leaves_the_model_and_the_random_stream_as_they_were() -> None:
    model = tiny_bert().eval()
    assert switchable(model) == "sdpa" and switchable(torch.nn.Linear(2, 2)) is None
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    ratio = measure_sdpa_over_eager(model, batch=2, seq=8, bf16=False, rounds=1)
    assert torch.equal(torch.rand(3), expected)  # dropout inside the timing drew from a forked stream
    assert math.isfinite(ratio) and ratio > 0  # its size is the host's business: a loaded CI runner skews one round
    assert not model.training and model.config._attn_implementation == "sdpa"
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(p, weights[n]) for n, p in model.named_parameters())


def test_auto_times_once_then_reads_the_cache(tmp_path) -> None:
    calls = []

    def fake(model, batch, seq, bf16, dropout):
        calls.append((batch, seq, bf16, dropout))
        return 1.25

    model, features = tiny_bert(), read_cpu_features()
    first = resolve_attention("auto", model, features, 4, 16, False, 1, tmp_path, measure=fake)
    second = resolve_attention("auto", model, features, 4, 16, False, 1, tmp_path, measure=fake)
    assert (first.name, first.source, second.name, second.source) == ("eager", "measured", "eager", "cached")
    assert calls == [(4, 16, False, "torch")]
    resolve_attention("auto", model, features, 4, 32, False, 1, tmp_path, measure=fake)  # another shape: timed
    assert len(calls) == 2
    # The fast dropout kernel makes eager's step shorter and not SDPA's: another timing.
    resolve_attention("auto", model, features, 4, 16, False, 1, tmp_path, measure=fake, dropout="fast")
    assert calls[-1] == (4, 16, False, "fast")
    assert resolve_attention("sdpa", model, features, 4, 16, False, 1, tmp_path, measure=fake).source == "requested"
    assert len(calls) == 3


def test_models_with_an_sdpa_path_are_switched_causal_lms_too() -> None:
    # An image model's config says "eager" too, but it has no attention; setting sdpa on it raises.
    resnet = ResNetForImageClassification(ResNetConfig(embedding_size=8, hidden_sizes=[8], depths=[1], num_labels=2))
    assert switchable(resnet) is None and not generates(resnet)
    # A causal LM is timed on the 4-D bool mask its packed batches carry (eager gets it as numbers).
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=32))
    assert switchable(gpt2) == "sdpa" and generates(gpt2) and not generates(tiny_bert())
    seen: list[torch.Tensor] = []
    heads: list[int] = []
    gpt2.register_forward_pre_hook(lambda m, args, kwargs: seen.append(kwargs["attention_mask"]), with_kwargs=True)
    gpt2.register_forward_hook(lambda m, args, out: heads.append(out.logits.shape[1]))
    ratio = measure_sdpa_over_eager(gpt2, batch=2, seq=8, bf16=False, rounds=1)
    assert 0.05 < ratio < 20 and gpt2.config._attn_implementation == "sdpa"
    assert {(m.dtype, m.dim()) for m in seen} == {(torch.bool, 4), (torch.float32, 4)}
    causal = next(m for m in seen if m.dtype == torch.bool)
    assert causal.shape == (2, 1, 8, 8) and torch.equal(causal[0, 0], torch.ones(8, 8, dtype=torch.bool).tril())
    assert all(torch.equal(m, attention_mask.additive(causal, torch.float32)) for m in seen if m.dtype != torch.bool)
    assert set(heads) == {1}  # the head's work is the same for both kernels: logits at the last position only


def test_a_model_too_slow_to_time_keeps_its_kernel(tmp_path: Path) -> None:
    model = tiny_bert()
    with pytest.raises(TooLongToTime, match="one step took"):
        measure_sdpa_over_eager(model, batch=1, seq=8, bf16=False, rounds=1, max_step_s=0.0)
    assert model.config._attn_implementation == "sdpa" and all(p.grad is None for p in model.parameters())

    def slow(*args: object) -> float:
        raise TooLongToTime("one step took 41 s")
    choice = resolve_attention("auto", model, read_cpu_features(), 4, 16, False, 1, tmp_path, measure=slow)
    assert (choice.name, choice.source) == ("sdpa", "model") and "41 s, too long to time" in choice.reason
    assert not (tmp_path / "attention.json").exists()  # nothing cached: a later run may time it


def test_timing_stays_inside_the_models_positions_and_vocabulary() -> None:
    model = tiny_bert()  # 512 positions, 500 ids
    seen: list[torch.Tensor] = []
    model.get_input_embeddings().register_forward_pre_hook(lambda module, args: seen.append(args[0].clone()))
    ratio = measure_sdpa_over_eager(model, batch=1, seq=600, bf16=False, rounds=1)
    assert math.isfinite(ratio) and ratio > 0
    assert seen and all(ids.shape == (1, 512) and 0 <= int(ids.min()) and int(ids.max()) < 500 for ids in seen)


def test_the_cache_keeps_the_ratio_the_ranks_agreed_on(tmp_path) -> None:
    # Rank 0 timed eager 1.05x, rank 1 1.01x: sdpa for both. Caching each rank's own ratio would leave whichever
    # wrote last, and the next run could pick eager; the smallest is what decided, so that is what is kept.
    timings = [decide_attention("auto", "sdpa", 1.05), decide_attention("auto", "sdpa", 1.01)]
    assert agree_attention(timings).name == "sdpa" and agreed_ratio(timings) == 1.01
    assert agreed_ratio([decide_attention("sdpa", "sdpa")]) is None  # nothing was timed
    model, features = tiny_bert(), read_cpu_features()
    fresh = resolve_attention("auto", model, features, 4, 16, False, 1, tmp_path, store=False, measure=lambda *a: 1.05)
    assert fresh.name == "eager" and fresh.source == "measured"
    assert not (tmp_path / "attention.json").exists()  # the caller stores after the ranks agree
    assert remember_attention(agreed_ratio(timings), model, features, 4, 16, False, 1, tmp_path)
    again = resolve_attention("auto", model, features, 4, 16, False, 1, tmp_path, measure=lambda *a: 9.0)
    assert (again.name, again.source, again.sdpa_over_eager) == ("sdpa", "cached", 1.01)


def tiny_llama(**config: object) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        attn_implementation="sdpa", **config))


def test_the_timed_layer_is_the_first_that_takes_its_kernel_from_the_config() -> None:
    bert, llama = tiny_bert(), tiny_llama()
    assert type(attention_layer(bert)).__name__ == "BertSelfAttention"
    assert attention_layer(bert) is bert.bert.encoder.layer[0].attention.self
    assert attention_layer(llama) is llama.model.layers[0].self_attn
    assert attention_layer(torch.nn.Sequential(torch.nn.Linear(2, 2))) is None


def test_one_layer_is_timed_on_the_inputs_each_kernel_gets_in_training() -> None:
    model = tiny_llama()
    layer = attention_layer(model)
    masks: list[torch.Tensor] = []
    kernels: list[str] = []

    def seen(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        masks.append(kwargs["attention_mask"])
        kernels.append(model.config._attn_implementation)
    layer.register_forward_pre_hook(seen, with_kwargs=True)
    backward: list[bool] = []  # whether the backward reached the layer's input, as in training
    layer.q_proj.register_full_backward_hook(lambda m, grad_in, grad_out: backward.append(grad_in[0] is not None))
    heads: list[int] = []
    model.lm_head.register_forward_hook(lambda m, args, out: heads.append(1))
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    ratio = measure_layer_sdpa_over_eager(model, batch=2, seq=8, bf16=False, budget_s=0.0)
    assert torch.equal(torch.rand(3), expected) and math.isfinite(ratio) and ratio > 0
    # Each kernel's layer got its mask in that kernel's form: the causal bool mask, and it as numbers for eager.
    by_kernel = {k: {(m.dtype, tuple(m.shape)) for m, kk in zip(masks, kernels) if kk == k} for k in ("sdpa", "eager")}
    assert by_kernel == {"sdpa": {(torch.bool, (2, 1, 8, 8))}, "eager": {(torch.float32, (2, 1, 8, 8))}}
    eager_mask = next(m for m, k in zip(masks, kernels) if k == "eager")
    assert torch.equal(eager_mask, attention_mask.additive(masks[0], torch.float32))
    assert kernels.count("sdpa") >= 1 + 1 + LAYER_MIN_ROUNDS and kernels.count("eager") == kernels.count("sdpa")
    assert backward == [True] * (kernels.count("sdpa") * 2 - 2)  # every timed call's backward; no record's
    assert heads == []  # the model's forward stops at the layer: nothing after it runs
    assert model.training and model.config._attn_implementation == "sdpa"
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(p, weights[n]) for n, p in model.named_parameters())


def test_a_model_with_no_attention_layer_to_time_is_timed_whole_on_a_few_rows(monkeypatch) -> None:
    from corecpu.compute import attention

    calls: list[tuple[str, int]] = []
    whole = lambda m, b, s, bf16, d: calls.append(("model", b)) or 1.0  # noqa: E731
    monkeypatch.setattr(attention, "measure_sdpa_over_eager", whole)
    monkeypatch.setattr(attention, "measure_layer_sdpa_over_eager", lambda m, b, s, bf16, d: calls.append(("layer", b))
                        or 2.0)
    assert attention.measure_attention_kernels(tiny_bert(), 32, 16, False) == 2.0 and calls == [("layer", 32)]
    monkeypatch.undo()
    monkeypatch.setattr(attention, "measure_sdpa_over_eager", whole)
    monkeypatch.setattr(attention, "attention_layer", lambda model: None)
    assert attention.measure_attention_kernels(tiny_bert(), 32, 16, False) == 1.0
    assert calls[-1] == ("model", attention.WHOLE_MODEL_BATCH)


def test_a_layer_too_slow_to_time_raises_and_leaves_the_model_as_it_was() -> None:
    model = tiny_llama()
    with pytest.raises(TooLongToTime, match="one attention layer took"):
        measure_layer_sdpa_over_eager(model, batch=1, seq=8, bf16=False, max_step_s=0.0)
    assert model.config._attn_implementation == "sdpa" and all(p.grad is None for p in model.parameters())


def test_eager_scores_count_every_layers_kept_softmax_and_none_where_sdpa_keeps_as_much() -> None:
    config = tiny_llama().config  # 2 layers, 4 heads, no attention dropout
    b, t, h = 3, 16, 4
    assert eager_scores_bytes(config, b, t, bf16=True) == (2 * 6 + 12) * b * h * t * t
    assert eager_scores_bytes(config, b, t, bf16=False) == (2 * 4 + 16) * b * h * t * t
    assert eager_scores_bytes(config, b, 2 * t, bf16=True) == 4 * eager_scores_bytes(config, b, t, bf16=True)
    # With attention dropout SDPA runs its math fallback on CPU, which keeps the scores too: eager costs no more.
    assert eager_scores_bytes(tiny_bert().config, b, t, bf16=True) == 0
    assert scores_room(2, None, None) is None
    assert scores_room(2, 8 * 2 ** 30, 16 * 2 ** 30) == int(SCORES_SHARE * 8 * 2 ** 30 / 2)


def test_eager_is_not_timed_where_its_scores_would_not_fit(tmp_path: Path) -> None:
    model, features = tiny_llama(), read_cpu_features()
    calls = []

    def fake(*args: object) -> float:
        calls.append(args)
        return 2.0
    need = eager_scores_bytes(model.config, 4, 64, True)
    kept = resolve_attention("auto", model, features, 4, 64, True, 1, tmp_path, measure=fake, room=need - 1)
    assert (kept.name, kept.source, calls) == ("sdpa", "memory", [])
    assert "eager attention would keep" in kept.reason and "--attention eager forces it" in kept.reason
    assert not (tmp_path / "attention.json").exists()
    timed = resolve_attention("auto", model, features, 4, 64, True, 1, tmp_path, measure=fake, room=need)
    assert (timed.name, timed.source, len(calls)) == ("eager", "measured", 1)
    forced = resolve_attention("eager", model, features, 4, 64, True, 1, tmp_path, measure=fake, room=0)
    assert forced.name == "eager" and forced.source == "requested"
