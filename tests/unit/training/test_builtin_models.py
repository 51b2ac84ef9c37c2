"""corecpu.training.builtin_models: built-in Llama models materialised once as ordinary Hugging Face directories,
the same bytes by every builder, safe to build from several processes at once; and modeling's use of them."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from corecpu.data.builtin_sft import builtin_sft
from corecpu.errors import CoreCPUError
from corecpu.training import builtin_models, modeling
from corecpu.training.builtin_models import (BUILTIN_CAUSAL, builtin_model_dir, causal_config, is_builtin_causal,
                                             train_tokenizer)

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def tiny_dir(cache, monkeypatch):
    """llama-tiny built once for this module (a few seconds), in a private cache."""
    monkeypatch.setenv("CORECPU_CACHE_DIR", str(cache))
    return builtin_model_dir("llama-tiny")


def digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_names():
    assert is_builtin_causal("llama-tiny") and is_builtin_causal("llama-135m")
    assert not is_builtin_causal("tiny") and not is_builtin_causal("default")
    with pytest.raises(CoreCPUError, match="unknown built-in model 'llama-huge'"):
        builtin_model_dir("llama-huge")


def test_llama_tiny_is_a_loadable_model_directory(tiny_dir, cache):
    assert tiny_dir == cache / "models" / "llama-tiny-v1"
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {p.name for p in tiny_dir.iterdir()}
    assert sorted(p.name for p in (cache / "models").iterdir() if p.name.startswith(".llama-tiny-v1.tmp")) == []
    tok = AutoTokenizer.from_pretrained(tiny_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, local_files_only=True)
    assert isinstance(model, LlamaForCausalLM) and model.config.tie_word_embeddings
    assert model.lm_head.weight is model.model.embed_tokens.weight
    n = sum(p.numel() for p in model.parameters())
    assert 0.5e6 < n < 5e6, n
    assert len(tok) == model.config.vocab_size == builtin_models.TOKENIZER_VOCAB
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "</s>", "<pad>")
    assert (model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id) == (
        tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    assert tok.model_max_length == model.config.max_position_embeddings == 512
    with torch.no_grad():
        logits = model(**tok(["Add 2 and 3."], return_tensors="pt")).logits
    assert logits.shape[-1] == len(tok) and torch.isfinite(logits).all()


def test_the_tokenizer_splits_prompt_and_completion_the_same_as_joined(tiny_dir):
    tok = AutoTokenizer.from_pretrained(tiny_dir, local_files_only=True)
    for prompt, completion in builtin_sft("eval")[:60]:
        joined = tok(prompt + completion)["input_ids"]
        assert joined[0] == tok.bos_token_id and tok.eos_token_id not in joined
        assert tok(prompt)["input_ids"] + tok(completion, add_special_tokens=False)["input_ids"] == joined
        assert tok.decode(joined, skip_special_tokens=True) == prompt + completion
    assert tok.convert_ids_to_tokens(tok("41", add_special_tokens=False)["input_ids"]) == ["4", "1"]
    assert 8 <= len(tok(builtin_sft("eval")[0][0])["input_ids"]) <= 60


def test_the_chat_template_renders_turns_and_a_generation_prompt(tiny_dir):
    tok = AutoTokenizer.from_pretrained(tiny_dir, local_files_only=True)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add 2 and 3."},
            {"role": "assistant", "content": "5"}]
    text = tok.apply_chat_template(chat, tokenize=False)
    assert text == "<s><|system|>\nBe brief.</s>\n<|user|>\nAdd 2 and 3.</s>\n<|assistant|>\n5</s>\n"
    prompt = tok.apply_chat_template(chat[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|assistant|>\n") and text.startswith(prompt)
    out = tok.apply_chat_template(chat, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    marked = [i for i, m in zip(out["input_ids"], out["assistant_masks"]) if m]
    assert tok.decode(marked) == "5</s>"
    assert len(tok.convert_tokens_to_ids(["<|user|>"])) == 1 and "<|user|>" in tok.all_special_tokens


def test_a_second_build_writes_the_same_bytes(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("CORECPU_CACHE_DIR", str(tmp_path))
    again = builtin_model_dir("llama-tiny")
    assert again != tiny_dir and digests(again) == digests(tiny_dir)


def test_an_existing_directory_is_used_not_rebuilt(tiny_dir, monkeypatch):
    monkeypatch.setattr(builtin_models, "_write", lambda *a: pytest.fail("rebuilt"))
    assert builtin_model_dir("llama-tiny") == tiny_dir


def test_builders_at_once_agree_and_leave_one_directory(tmp_path):
    # Three processes build into an empty cache together: one directory, complete, no temporaries, and every
    # process gets it. Without the lock (the filesystem's flock refused) the rename race alone decides.
    code = ("import sys; from corecpu.training import builtin_models as b\n"
            "if sys.argv[1] == 'nolock':\n"
            "    import contextlib; b._host_lock = lambda path: contextlib.nullcontext()\n"
            "print(b.builtin_model_dir('llama-tiny'))")
    for mode, cache in (("lock", tmp_path / "a"), ("nolock", tmp_path / "b")):
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "CORECPU_CACHE_DIR": str(cache),
               "OMP_NUM_THREADS": "1", "HOME": str(tmp_path)}
        procs = [subprocess.Popen([sys.executable, "-c", code, mode], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(3)]
        outs = [p.communicate(timeout=300) for p in procs]
        assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
        target = cache / "models" / "llama-tiny-v1"
        assert {out.strip().splitlines()[-1] for out, _ in outs} == {str(target)}
        assert [p.name for p in (cache / "models").iterdir() if not p.name.endswith(".lock")] == ["llama-tiny-v1"]
        AutoModelForCausalLM.from_pretrained(target, local_files_only=True)
    assert digests(tmp_path / "a" / "models" / "llama-tiny-v1") == digests(tmp_path / "b" / "models" / "llama-tiny-v1")


def test_an_unwritable_cache_says_what_to_do(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("CORECPU_CACHE_DIR", str(tmp_path / "file"))
    with pytest.raises(CoreCPUError, match=r"cannot build the built-in model llama-tiny .* set CORECPU_CACHE_DIR"):
        builtin_model_dir("llama-tiny")


def test_llama_135m_has_smollm_shapes():
    # On the meta device: shapes and the parameter count without 0.5 GB of weights.
    config = causal_config("llama-135m", train_tokenizer(2048))
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
            config.intermediate_size, config.vocab_size, config.max_position_embeddings) == (
        576, 30, 9, 3, 1536, 49152, 2048)
    assert config.tie_word_embeddings and config.rope_parameters["rope_theta"] == 10000.0
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    n = sum(p.numel() for p in model.parameters())
    assert 134_000_000 < n < 135_000_000, n


def test_weights_are_uniform_with_the_configured_spread():
    w = builtin_models._uniform("k", torch.Size([256, 256]), 0.02)
    assert abs(w.std().item() - 0.02) < 0.001 and abs(w.mean().item()) < 0.001 and w.abs().max() <= 0.02 * 3**0.5
    assert torch.equal(w, builtin_models._uniform("k", torch.Size([256, 256]), 0.02))
    assert not torch.equal(w, builtin_models._uniform("j", torch.Size([256, 256]), 0.02))


# ---------------------------------------------------------------- through corecpu.training.modeling


def test_modeling_reads_the_builtin_directory(tiny_dir):
    assert modeling.resolve_model_dir("llama-tiny") == tiny_dir
    assert modeling.weights_bytes("llama-tiny") == (tiny_dir / "model.safetensors").stat().st_size > 1_000_000
    tok = modeling.load_tokenizer("llama-tiny")
    assert modeling.model_limits("llama-tiny", tok) == (len(tok), 512)
    modeling.check_inputs("llama-tiny", tok, 512)
    with pytest.raises(CoreCPUError, match="--max-seq-len 512 or less"):
        modeling.check_inputs("llama-tiny", tok, 513)


def test_modeling_accepts_llama_135m_whose_embedding_is_larger_than_its_tokenizer(tiny_dir, monkeypatch):
    # Its 49152 rows are not a sign of a wrong tokenizer (as they would be for a directory a user passes).
    # A stand-in directory with its config, so the test does not write 0.5 GB.
    tok = modeling.load_tokenizer("llama-tiny")
    fake = tiny_dir.parent / "fake-135m"
    fake.mkdir(exist_ok=True)
    causal_config("llama-135m", tok).to_json_file(fake / "config.json")
    monkeypatch.setattr(modeling, "builtin_model_dir", lambda name: fake)
    assert modeling.model_limits("llama-135m", tok) == (49152, 2048)
    modeling.check_inputs("llama-135m", tok, 1024)
    with pytest.raises(CoreCPUError, match="only 2048 tokens"):
        modeling.check_inputs(str(fake), tok, 1024)  # the same directory passed by path keeps the check


def test_bert_names_are_unchanged():
    assert modeling.weights_bytes("tiny") == 0
    assert not is_builtin_causal("tiny") and "llama-tiny" in BUILTIN_CAUSAL


def test_any_rank_of_a_job_builds_the_whole_directory(tmp_path, monkeypatch):
    """transformers' save_pretrained writes nothing on a rank other than 0 of an initialised process group; the
    rank of a host that takes the build lock first may be any rank."""
    monkeypatch.setenv("CORECPU_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda *a, **k: 1)
    built = builtin_model_dir("llama-tiny")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in built.iterdir()}
