"""corecpu.compute.embedding_grad: the input embedding's gradient on memory kept between steps is torch's, bit for
bit, however the loop zeroes, accumulates or holds gradients; rows written elsewhere are zeroed or found."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel

from corecpu.compute import embedding_grad
from corecpu.compute.embedding_grad import install


class _Tiny(torch.nn.Module):
    def __init__(self, lookups: int = 1, **embedding: object) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(64, 8, padding_idx=0, **embedding)  # type: ignore[arg-type]
        self.head = torch.nn.Linear(8, 1)
        self.lookups = lookups

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.embed

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = sum(self.embed(ids + k) for k in range(self.lookups))
        return self.head(torch.tanh(hidden)).square().mean()


def _ids(step: int) -> torch.Tensor:
    ids = torch.randint(0, 60, (4, 9), generator=torch.Generator().manual_seed(step))
    ids[:, -2:] = 0  # padding
    ids[0, :3] = 7  # a row looked up several times: its contributions sum in order
    return ids


def _pair(lookups: int = 1) -> tuple[_Tiny, _Tiny, embedding_grad.RecycledEmbeddingGrad]:
    plain = _Tiny(lookups)
    kept = copy.deepcopy(plain)
    choice, owner = install(kept, compile=False, use_ipex=False)
    assert choice.name == "recycled" and owner is not None
    return plain, kept, owner


def _grads(*models: _Tiny) -> list[torch.Tensor]:
    return [m.embed.weight.grad for m in models]


@pytest.mark.parametrize("threads", [1, 2])
def test_bit_for_bit_torchs_gradient_on_memory_kept_between_steps(threads: int) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        plain, kept, owner = _pair()
        for step in range(4):
            for model in (plain, kept):
                model(_ids(step)).backward()
            want, got = _grads(plain, kept)
            assert torch.equal(got, want) and got[0].abs().sum() == 0  # padding row untouched
            assert got.data_ptr() == owner._alias.data_ptr()  # autograd took the kept memory, no copy
            del want, got
            plain.zero_grad(set_to_none=True)
            kept.zero_grad(set_to_none=True)
        assert (owner.fresh, owner.recycled) == (1, 3)
    finally:
        torch.set_num_threads(before)


def test_a_held_gradient_is_never_overwritten() -> None:
    plain, kept, owner = _pair()
    kept(_ids(0)).backward()
    held, copy_of_held = kept.embed.weight.grad, kept.embed.weight.grad.clone()
    kept.zero_grad(set_to_none=True)
    kept(_ids(1)).backward()  # the user still holds last step's gradient: new memory this step
    assert torch.equal(held, copy_of_held) and owner.recycled == 0
    plain(_ids(1)).backward()
    assert torch.equal(*_grads(kept, plain))


@pytest.mark.parametrize("set_to_none", [True, False])
def test_accumulation_and_either_zero_grad_match_torch(set_to_none: bool) -> None:
    plain, kept, _ = _pair(lookups=2)  # two lookups a forward: the second backward call gets new memory
    for step in range(3):
        for micro in range(2):  # accumulated over two micro-steps
            for model in (plain, kept):
                model(_ids(10 * step + micro)).backward()
        assert torch.equal(*_grads(plain, kept))
        plain.zero_grad(set_to_none=set_to_none)
        kept.zero_grad(set_to_none=set_to_none)


def test_rows_another_writer_names_are_zeroed() -> None:
    plain, kept, owner = _pair()
    for step in range(3):
        for model in (plain, kept):
            model(_ids(step)).backward()
        assert torch.equal(*_grads(plain, kept))
        rows = torch.tensor([40 + step, 50 + step])
        with torch.no_grad():  # as sparse_rows' all-reduce writes other ranks' rows
            kept.embed.weight.grad[rows] = 1.0
        owner.mark_written(rows)
        plain.zero_grad(set_to_none=True)
        kept.zero_grad(set_to_none=True)
    assert owner.rows_only and owner.recycled == 2


def test_a_row_written_unannounced_is_found_by_the_first_check() -> None:
    plain, kept, owner = _pair()
    for model in (plain, kept):
        model(_ids(0)).backward()
    with torch.no_grad():
        kept.embed.weight.grad[63] = 5.0  # a writer this module does not know of (gradient noise)
    plain.zero_grad(set_to_none=True)
    kept.zero_grad(set_to_none=True)
    for model in (plain, kept):
        model(_ids(1)).backward()
    assert torch.equal(*_grads(plain, kept)) and not owner.rows_only


def test_a_bert_classifier_gets_torchs_embedding_gradient() -> None:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    plain = BertForSequenceClassification(config)
    kept = copy.deepcopy(plain)
    assert install(kept, compile=False, use_ipex=False)[0].name == "recycled"
    batch = {"input_ids": _ids(3), "labels": torch.tensor([0, 1, 0, 1])}
    for step in range(2):
        for model in (plain, kept):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(**batch).loss
            loss.backward()
        want, got = (m.get_input_embeddings().weight.grad for m in (plain, kept))
        assert torch.equal(got, want)
        del want, got
        plain.zero_grad(set_to_none=True)
        kept.zero_grad(set_to_none=True)


def test_where_it_does_not_apply_torchs_backward_stays() -> None:
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_embd=16, n_layer=1, n_head=2, n_positions=16))
    assert install(gpt2, compile=False, use_ipex=False)[0].reason.startswith("the input embedding is tied")
    assert install(_Tiny(), compile=True, use_ipex=False)[0].name == "torch"
    assert install(_Tiny(), compile=False, use_ipex=True)[0].name == "torch"
    assert install(_Tiny(scale_grad_by_freq=True), compile=False, use_ipex=False)[0].name == "torch"
    frozen = _Tiny()
    frozen.embed.weight.requires_grad_(False)
    assert install(frozen, compile=False, use_ipex=False)[0].name == "torch"
    twice = _Tiny()
    assert install(twice, compile=False, use_ipex=False)[0].name == "recycled"
    assert install(twice, compile=False, use_ipex=False)[0].name == "torch"  # already patched: not twice


def test_no_grad_lookups_and_close_are_torchs() -> None:
    model = _Tiny()
    _, owner = install(model, compile=False, use_ipex=False)
    with torch.no_grad():
        assert torch.equal(model.embed(_ids(0)), torch.nn.functional.embedding(_ids(0), model.embed.weight, 0))
    owner.close()
    assert "forward" not in vars(model.embed)


def test_the_kept_gradient_vouches_for_its_written_rows_until_something_writes_it() -> None:
    from corecpu.training.clipping import GradientClipper

    _, kept, owner = _pair()
    clipper = GradientClipper(kept.parameters(), None, [owner])
    for step in range(3):
        kept(_ids(step)).backward()
        grad = kept.embed.weight.grad
        rows = owner.reduced_rows(grad)  # the first step's new memory is kept too, zeroed and written the same way
        assert rows is not None and set(rows.tolist()) == set(_ids(step).flatten().tolist())
        assert not grad.index_fill(0, rows, 0).any()  # every nonzero row is among them
        full = float(torch.nn.utils.get_total_norm([p.grad for p in kept.parameters()]))
        assert abs(float(clipper(1e9, fold=False)) - full) <= 1e-6 * full
        grad.mul_(1)  # written since: no longer vouched for
        assert owner.reduced_rows(grad) is None
        del grad  # holding it would keep the memory from being reused
        kept.zero_grad(set_to_none=True)
    assert owner.recycled == 2  # steps 2 and 3 on the memory kept from step 1
