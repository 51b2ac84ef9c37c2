"""Tier 1: --task causal-lm's own pieces: options and defaults, LoRA targets, refusing a model that is no causal LM,
the prompts evaluation completes, and the token-weighted eval loss."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from corecpu.data.causal_tokens import Tokenized
from corecpu.errors import CoreCPUError
from corecpu.tasks.causal_eval import eval_loss
from corecpu.tasks.causal_lm import _prompts
from corecpu.tasks.registry import parse_config
from corecpu.training.causal_model import load_causal_lm
from corecpu.training.label_logits import compute_logits_where_labelled
from corecpu.training.lora import LoraSettings, add_lora, check_targets, linear_names
from corecpu.training.modeling import default_model_dir


def _llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1))


def test_defaults_follow_the_model_and_the_adapter():
    cfg = parse_config(["--task", "causal-lm"])
    assert (cfg.model, cfg.data, cfg.max_seq_len, cfg.lr, cfg.batch_size, cfg.epochs) == ("llama-tiny", "sft", 128, 1e-3, 4, 8)
    assert (parse_config([]).batch_size, parse_config([]).epochs) == (16, 3)
    assert parse_config(["--task", "causal-lm", "--lora-r", "8"]).lr == 2e-4
    assert parse_config(["--task", "causal-lm", "--model", "/models/x"]).lr == 2e-5
    assert parse_config(["--task", "causal-lm", "--lr", "3e-4"]).lr == 3e-4
    assert parse_config([]).model == "default" and parse_config([]).lr == 1e-4  # classification unchanged


def test_lora_targets_the_model_lacks_are_named_with_the_ones_it_has():
    model = _llama()
    assert linear_names(model) == ["down_proj", "gate_proj", "k_proj", "lm_head", "o_proj", "q_proj", "up_proj",
                                   "v_proj"]
    with pytest.raises(CoreCPUError, match="^--lora-target-modules query: this model has no such linear layer; "
                                           "it has down_proj,gate_proj"):
        check_targets(model, ("q_proj", "query"))


def test_lora_freezes_the_base_and_trains_only_adapters():
    model = add_lora(_llama(), LoraSettings(4, 8.0, 0.0, ()), 0)
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n in trained)
    assert not any("lm_head" in n for n in trained)  # all-linear leaves the output layer alone


def test_a_model_that_is_no_causal_lm_is_refused_in_one_line():
    try:
        bert = default_model_dir()
    except CoreCPUError:
        pytest.skip("the demo extra (MiniLM) is not installed")
    with pytest.raises(CoreCPUError, match="holds a bert model, which is not a causal language model; pass --model "
                                           "with a causal LM directory"):
        load_causal_lm(str(bert), 0)


def test_prompts_are_the_tokens_before_the_first_target_and_references_the_first_run_of_targets():
    tok = Tokenized(input_ids=[[1, 5, 6, 7, 8, 2], [1, 9, 9, 2], [3, 4]],
                    loss_mask=[[0, 0, 0, 1, 1, 1], [0, 1, 1, 1], [1, 1]], truncated=0)
    assert _prompts(tok, 5) == [([1, 5, 6], [7, 8, 2]), ([1], [9, 9, 2])]  # plain text (no prompt) skipped
    assert _prompts(tok, 1) == [([1, 5, 6], [7, 8, 2])] and _prompts(None, 3) == []


@pytest.mark.parametrize("patched", [True, False])
def test_eval_loss_weighs_every_label_token_and_skips_filler_rows(patched):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=31, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1)).eval()
    if patched:
        assert compute_logits_where_labelled(model)
    ids = torch.randint(0, 31, (2, 5))
    batches = [
        {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.tensor([[-100, 1, 2, -100, 3],
         [-100, 3, 4, 5, 6]]), "valid": torch.tensor([True, False]), "num_tokens": 10, "num_padded": 0,
         "num_label_tokens": 3},
        {"input_ids": ids[:1], "attention_mask": torch.ones_like(ids[:1]), "labels": torch.tensor([[-100, -100, 7, 8,
         -100]]), "valid": torch.tensor([True]), "num_tokens": 5, "num_padded": 0, "num_label_tokens": 2},
    ]
    with torch.no_grad():
        logits = type(model).forward(model, input_ids=ids[:1]).logits[0]  # the same row in both batches
    every = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor([1, 2, -100, 3]), reduction="sum")
    every += torch.nn.functional.cross_entropy(logits[:-1], torch.tensor([-100, 7, 8, -100]), reduction="sum")
    run = SimpleNamespace(all_reduce_sum=lambda xs: xs)
    scores = eval_loss(run, model, [dict(b) for b in batches])
    assert scores["eval_tokens"] == 5 and scores["eval_examples"] == 2  # rank 1's filler row counted nothing
    assert scores["eval_loss"] == pytest.approx(float(every) / 5, rel=1e-5)


def test_a_run_the_node_cannot_hold_stops_before_training_and_one_that_fits_says_what_it_takes(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from corecpu.tasks import causal_lm
    from corecpu.tasks.registry import make_task
    from corecpu.training.modeling import load_tokenizer

    monkeypatch.setenv("CORECPU_CACHE_DIR", str(tmp_path))
    cfg = parse_config(["--task", "causal-lm", "--output-dir", str(tmp_path / "out")])
    task = make_task(cfg)
    data = task.load()
    task.model(data)
    tokenizer, run = load_tokenizer(cfg.model), SimpleNamespace(launch=SimpleNamespace(local_world_size=2))
    task.features(data, tokenizer, run)
    assert "; memory about " in task.describe(data) and "2 rank(s) x" in task.describe(data)
    monkeypatch.setattr(causal_lm, "node_budget", lambda local_ranks: (None, 64 * 2**20))
    with pytest.raises(CoreCPUError, match="but the memory available on this host is 64 MB; use train LoRA adapters"):
        task.features(data, tokenizer, run)
