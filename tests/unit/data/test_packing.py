"""Tier 1: packing causal-LM examples into bins and collating them (corecpu.data.packing): bins hold every
example once within capacity, labels/positions/mask keep packed documents apart, and a small Llama's summed
loss over a packed batch equals the sum of its documents' separate losses."""

from __future__ import annotations

import random

import pytest
import torch

from corecpu.data.causal_tokens import Tokenized
from corecpu.data.packing import IGNORE, CausalFeatures, make_causal_collate, pack_bins
from corecpu.errors import CoreCPUError


def test_best_fit_decreasing_on_a_small_case():
    # 5 opens bin 0 (room 3); 4 opens bin 1 (room 4); the first 3 fits bin 0 exactly; the second 3 and the 1 fill bin 1.
    assert pack_bins([5, 4, 3, 3, 1], 8) == [[0, 2], [1, 3, 4]]
    assert pack_bins([2, 2, 2], 4) == [[0, 1], [2]]  # equal lengths: by index
    assert pack_bins([], 4) == []
    with pytest.raises(CoreCPUError, match="example 1 has 9 tokens, more than the bin capacity 8"):
        pack_bins([3, 9], 8)


@pytest.mark.parametrize("seed", range(5))
def test_every_example_once_within_capacity_and_deterministic(seed):
    rng = random.Random(seed)
    capacity = rng.choice([16, 64, 100])
    lengths = [rng.randint(1, capacity) for _ in range(rng.randint(1, 300))]
    bins = pack_bins(lengths, capacity)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= capacity for b in bins)
    assert pack_bins(list(lengths), capacity) == bins
    # Best fit leaves at most one bin half empty or less: two such bins would have been merged.
    assert sum(sum(lengths[i] for i in b) * 2 <= capacity for b in bins) <= 1
    assert len(bins) >= -(-sum(lengths) // capacity)


TOK = Tokenized(input_ids=[[11, 12, 13], [21, 22], [31, 32, 33, 34]],
                loss_mask=[[1, 1, 1], [0, 1], [0, 0, 1, 1]], truncated=0)


def test_features_packed_and_unpacked():
    flat = CausalFeatures(TOK, 8, packing=False)
    assert len(flat) == 3 and flat.lengths == [3, 2, 4] and flat.label_tokens == [2, 1, 2]
    assert flat[1] == {"input_ids": [21, 22], "loss_mask": [0, 1], "doc_lens": [2], "valid": True}
    packed = CausalFeatures(TOK, 6, packing=True)
    assert packed.groups == [[2, 1], [0]] and packed.lengths == [6, 3] and packed.label_tokens == [3, 2]
    assert packed[(0, False)] == {"input_ids": [31, 32, 33, 34, 21, 22], "loss_mask": [0, 0, 1, 1, 0, 1],
                                  "doc_lens": [4, 2], "valid": False}


def test_collate_labels_positions_and_block_causal_mask():
    feats = CausalFeatures(TOK, 6, packing=True)
    batch = make_causal_collate(pad_id=0, pad_to_multiple_of=4)([feats[0], feats[(1, False)]])
    assert batch["input_ids"].tolist() == [[31, 32, 33, 34, 21, 22, 0, 0], [11, 12, 13, 0, 0, 0, 0, 0]]
    # -100 where the mask is 0, at every document's first token (13->21 is not a target) and on padding.
    assert batch["labels"].tolist() == [[IGNORE, IGNORE, 33, 34, IGNORE, 22, IGNORE, IGNORE],
                                        [IGNORE, 12, 13, IGNORE, IGNORE, IGNORE, IGNORE, IGNORE]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 0, 1], [0, 1, 2, 0, 1, 2, 3, 4]]
    segments = [[0, 0, 0, 0, 1, 1, 2, 2], [0, 0, 0, 1, 1, 1, 1, 1]]
    expect = torch.tensor([[[s[q] == s[k] and k <= q for k in range(8)] for q in range(8)] for s in segments])
    assert batch["attention_mask"].dtype == torch.bool and batch["attention_mask"].shape == (2, 1, 8, 8)
    assert torch.equal(batch["attention_mask"][:, 0], expect)
    assert (batch["num_tokens"], batch["num_padded"], batch["num_label_tokens"]) == (9, 7, 5)
    assert batch["num_attended"] == 4 ** 2 + 2 ** 2 + 3 ** 2  # each document over itself, padding over nothing
    assert batch["valid"].tolist() == [True, False]
    assert make_causal_collate(0, pad_to_multiple_of=4, max_len=7)([feats[0]])["input_ids"].shape == (1, 7)


def test_a_packed_batch_loses_what_its_documents_lose_apart():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      initializer_range=0.2)  # sharper than the default: a leak shows
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa").eval()
    gen = torch.Generator().manual_seed(1)
    docs = [torch.randint(3, 100, (n,), generator=gen).tolist() for n in (9, 5, 12, 3, 7, 10)]
    masks = [[0] * (n // 3) + [1] * (n - n // 3) for n in map(len, docs)]  # a "prompt" without loss first
    with torch.no_grad():
        apart = 0.0
        for ids, mask in zip(docs, masks):
            labels = torch.tensor([t if m else IGNORE for t, m in zip(ids, mask)])
            n = int((labels[1:] != IGNORE).sum())
            apart += model(input_ids=torch.tensor([ids]), labels=labels[None], num_items_in_batch=n).loss * n
    for packing in (True, False):  # unpacked, the mask is causal plus padding
        feats = CausalFeatures(Tokenized(docs, masks, truncated=0), 16, packing=packing)
        assert (len(feats) < len(docs)) == packing
        batch = make_causal_collate(pad_id=0, pad_to_multiple_of=8)([feats[i] for i in range(len(feats))])
        count = batch.pop("num_label_tokens")
        for key in ("num_tokens", "num_padded", "valid"):
            batch.pop(key)
        assert count == sum(feats.label_tokens)
        with torch.no_grad():
            together = model(**batch, num_items_in_batch=count).loss * count
            # The test can fail: a plain causal mask over the packed rows lets documents see each other.
            leaky = dict(batch, attention_mask=torch.ones_like(batch["attention_mask"]).tril())
            leaked = model(**leaky, num_items_in_batch=count).loss * count
        assert torch.allclose(together, apart, rtol=1e-5, atol=0), (packing, together, apart)
        if packing:
            assert not torch.allclose(leaked, apart, rtol=1e-2, atol=0), (leaked, apart)
