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
