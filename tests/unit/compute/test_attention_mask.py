"""corecpu.compute.attention_mask: inside corecpu's autocasting forward, eager attention's padding mask is built in
bf16, so a padded batch's attention probabilities stay bf16; outside it, transformers' mask is unchanged."""

from __future__ import annotations

import threading

import torch
from transformers import BertConfig, BertForSequenceClassification

from corecpu.compute import attention_mask
from corecpu.compute.attention_mask import masks_in_autocast_dtype


def _model() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, attn_implementation="eager")
    return BertForSequenceClassification(config).eval()


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(5, 300, (4, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    mask[3, 3:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _softmax_dtypes(model: torch.nn.Module, batch: dict[str, torch.Tensor], inside: bool) -> tuple[set, torch.Tensor]:
    """The dtypes eager attention's softmax ran in, and the logits, for one autocast forward."""
    seen: set[torch.dtype] = set()
    original = torch.nn.functional.softmax

    def spy(x: torch.Tensor, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.add(x.dtype)
        return original(x, *args, **kwargs)

    torch.nn.functional.softmax = spy
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            if inside:
                with masks_in_autocast_dtype():
                    logits = model(**batch).logits
            else:
                logits = model(**batch).logits
    finally:
        torch.nn.functional.softmax = original
    return seen, logits.float()


def test_padded_attention_runs_in_bf16_inside_and_as_before_outside() -> None:
    assert attention_mask.install() and attention_mask.install()  # idempotent: wrapped once
    model, batch = _model(), _batch()
    outside, before = _softmax_dtypes(model, batch, inside=False)
    inside, after = _softmax_dtypes(model, batch, inside=True)
    assert outside == {torch.float32}  # transformers' fp32 mask promotes the scores
    assert inside == {torch.bfloat16}
    # The same scores reach the softmax (0 and the minimum are exact in bf16): only rounding differs.
    torch.testing.assert_close(after, before, atol=2e-2, rtol=0)
    unpadded = {k: v[[0, 2]] for k, v in batch.items()}  # no padding: transformers skips the mask either way
    assert _softmax_dtypes(model, unpadded, inside=True)[0] == {torch.bfloat16}


def test_only_the_thread_inside_the_context_gets_the_bf16_mask() -> None:
    attention_mask.install()
    model, batch = _model(), _batch()
    other: dict[str, set] = {}
    with masks_in_autocast_dtype():
        worker = threading.Thread(target=lambda: other.setdefault("dtypes", _softmax_dtypes(model, batch, False)[0]))
        worker.start()
        worker.join()
    assert other["dtypes"] == {torch.float32}


def test_fp32_training_is_untouched() -> None:
    attention_mask.install()
    model, batch = _model(), _batch()
    with torch.no_grad():
        plain = model(**batch).logits
        with masks_in_autocast_dtype():  # no autocast: the mask stays fp32, the logits the same bits
            assert torch.equal(model(**batch).logits, plain)


def _packed_llama(kernel: str) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config)
    model.set_attn_implementation(kernel)
    return model


def _packed_batch() -> dict[str, torch.Tensor]:
    from corecpu.data.packing import make_causal_collate
    from corecpu.data.tokenized import pop_meta

    g = torch.Generator().manual_seed(3)
    items = [{"input_ids": torch.randint(1, 96, (n1 + n2,), generator=g).tolist(), "loss_mask": [1] * (n1 + n2),
              "doc_lens": [n1, n2]} for n1, n2 in ((5, 9), (7, 4), (12, 2))]
    batch = make_causal_collate(0, 0, 16)(items)
    pop_meta(batch)
    return batch


def test_eager_attention_gets_packed_bool_masks_as_numbers() -> None:
    batch = _packed_batch()
    assert batch["attention_mask"].dtype == torch.bool and batch["attention_mask"].dim() == 4
    sdpa = _packed_llama("sdpa")(**batch).loss
    eager = _packed_llama("eager")
    unconverted = eager(**batch).loss  # the booleans added as 0 and 1: packed documents see each other
    assert attention_mask.add_bool_masks_as_numbers(eager, torch.float32)
    assert not attention_mask.add_bool_masks_as_numbers(eager, torch.float32)  # once per model
    converted = eager(**batch).loss
    assert torch.allclose(converted, sdpa, rtol=1e-5) and not torch.allclose(unconverted, sdpa, rtol=1e-3)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # under autocast: the mask in bf16, as the scores are
        bf16 = _packed_llama("eager")
        attention_mask.add_bool_masks_as_numbers(bf16, torch.bfloat16)
        assert torch.allclose(bf16(**batch).loss, _packed_llama("sdpa")(**batch).loss, rtol=2e-2)
    eager.set_attn_implementation("sdpa")  # the hook leaves a model that went back to sdpa alone
    assert torch.equal(eager(**batch).loss, sdpa)
    ones = {"input_ids": batch["input_ids"], "attention_mask": torch.ones_like(batch["input_ids"])}
    eager.set_attn_implementation("eager")  # a 2-D mask is transformers' to build
    assert torch.equal(eager(**ones).logits, _packed_llama("eager")(**ones).logits)


def test_additive_masks_are_zero_where_seen_and_the_minimum_elsewhere() -> None:
    mask = torch.tensor([[True, False], [True, True]])
    for dtype in (torch.float32, torch.bfloat16):
        out = attention_mask.additive(mask, dtype)
        assert out.dtype == dtype and out[0, 0] == 0 and out[1, 1] == 0 and out[0, 1] == torch.finfo(dtype).min
