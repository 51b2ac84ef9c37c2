"""Built-in causal LMs (`--model llama-tiny`, `llama-135m`): Llama-architecture models built from a config,
randomly initialised, so that `--task causal-lm` runs with nothing downloaded.

    path = builtin_model_dir("llama-tiny")   # $CORECPU_CACHE_DIR/models/llama-tiny-v1, built on first use
    AutoModelForCausalLM.from_pretrained(path); AutoTokenizer.from_pretrained(path)

Each is materialised once per machine as an ordinary Hugging Face model directory (config.json,
generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json, chat_template.jinja), so
every path that reads a model directory works unchanged. Building is deterministic: the tokenizer is a
byte-level BPE trained on corecpu.data.builtin_sft.tokenizer_corpus() (2048 tokens, digits split one by
one so that sums generalise), and the weights come from SHAKE-256 of the seed and the parameter's name,
not from torch's generator, so every process on every machine writes the same bytes. Processes that
build at once are safe: a lock file lets one build while the others on the host wait, and each build is
renamed into place only if none is there yet (corecpu.atomic.place_dir), so the first complete copy wins.

Both models share the tokenizer. llama-135m has SmolLM-135M's shapes, vocabulary 49152 included: the
embedding rows past the tokenizer's 2048 tokens are never looked up (and their logits, tied to those rows,
only learn to stay low).

Tokenizer conventions: `tokenizer(text)` starts with <s> (as Llama's does), never adds </s>; pad is <pad>.
The chat template renders `<s><|role|>\\ncontent</s>\\n` per message and `<|assistant|>\\n` for
add_generation_prompt; assistant content is marked for return_assistant_tokens_mask.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

if TYPE_CHECKING:
    from transformers import LlamaConfig, LlamaForCausalLM

from corecpu import atomic, envvars
from corecpu.data.builtin_sft import tokenizer_corpus
from corecpu.errors import CoreCPUError, os_problem

VERSION = 1  # part of the directory name: bump it when a change to the recipe changes the files
SEED = 0
TOKENIZER_VOCAB = 2048
BOS, EOS, PAD = "<s>", "</s>", "<pad>"
ROLES = ("<|system|>", "<|user|>", "<|assistant|>")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<|' + message['role'] + '|>\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}{{ '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


@dataclass(frozen=True)
class CausalShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    max_positions: int
    vocab: int | None = None  # None: the tokenizer's size
    rope_theta: float = 10000.0
    std: float = 0.02  # of the initial weights (LlamaConfig.initializer_range)


BUILTIN_CAUSAL: dict[str, CausalShape] = {
    # 1.05M parameters (0.26M of them the tied embedding); benchmarks/sft_smoke.py shows how far it learns the sft set.
    "llama-tiny": CausalShape(hidden=128, layers=4, heads=4, kv_heads=2, intermediate=384, max_positions=512),
    # SmolLM-135M's shapes: 134.5M parameters, 0.54 GB in fp32.
    "llama-135m": CausalShape(hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536, max_positions=2048,
                              vocab=49152),
}


def is_builtin_causal(spec: str) -> bool:
    return spec in BUILTIN_CAUSAL


def causal_config(name: str, tokenizer: PreTrainedTokenizerFast) -> LlamaConfig:
    """The LlamaConfig of built-in model `name` with `tokenizer`'s special ids."""
    from transformers import LlamaConfig  # here: Llama's modules cost every task's ranks 1.2 s of start-up
    s = BUILTIN_CAUSAL[name]
    return LlamaConfig(
        vocab_size=s.vocab or len(tokenizer), hidden_size=s.hidden, intermediate_size=s.intermediate,
        num_hidden_layers=s.layers, num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
        max_position_embeddings=s.max_positions, rope_parameters={"rope_type": "default", "rope_theta": s.rope_theta},
        rms_norm_eps=1e-5, tie_word_embeddings=True, initializer_range=s.std, attention_dropout=0.0,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )


def train_tokenizer(max_length: int) -> PreTrainedTokenizerFast:
    """The built-in byte-level BPE, trained on tokenizer_corpus() (about a second); the same on every run."""
    tok = Tokenizer(models.BPE())
    # Digits one by one (as Llama's and SmolLM's tokenizers do): "41" as one token would make sums a lookup
    # table of pairs, which eval (pairs training never showed) cannot answer.
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TOKENIZER_VOCAB, special_tokens=[PAD, BOS, EOS, *ROLES], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(tokenizer_corpus(), trainer)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A $B:1",
                                                       special_tokens=[(BOS, tok.token_to_id(BOS))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   extra_special_tokens=list(ROLES), model_max_length=max_length)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _uniform(key: str, shape: torch.Size, std: float) -> torch.Tensor:
    """Uniform weights of standard deviation `std` from SHAKE-256 of `key`: the same bits on any machine
    and any torch version (16-bit integers read little-endian, scaled in float64)."""
    n = math.prod(shape)
    raw = torch.frombuffer(bytearray(hashlib.shake_256(key.encode()).digest(2 * n)), dtype=torch.uint8)
    ints = raw[0::2].to(torch.int32) + 256 * raw[1::2].to(torch.int32) - 32768  # -32768..32767
    half_width = std * math.sqrt(3.0)  # uniform on [-a, a] has std a/sqrt(3)
    return ((ints.to(torch.float64) + 0.5) * (half_width / 32768)).to(torch.float32).reshape(shape)


def build_model(config: LlamaConfig, seed: int = SEED) -> LlamaForCausalLM:
    """A LlamaForCausalLM with every parameter set from (seed, its name): RMSNorm scales 1, matrices uniform."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():  # the tied lm_head is the embedding: listed once
            if p.ndim == 1:
                p.fill_(1.0)
            else:
                p.copy_(_uniform(f"corecpu-{seed}|{name}", p.shape, config.initializer_range))
    return model


def _write(name: str, directory: Path) -> None:
    tokenizer = train_tokenizer(BUILTIN_CAUSAL[name].max_positions)
    model = build_model(causal_config(name, tokenizer))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    # Not model.save_pretrained: under an initialised process group transformers writes only on rank 0, and
    # whichever rank of a host takes the lock first builds. The same files, written here by any rank.
    model.config.save_pretrained(directory)
    model.generation_config.save_pretrained(directory)
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # the embedding itself, listed once as save_pretrained does
    save_file({k: v.contiguous() for k, v in state.items()}, str(directory / "model.safetensors"),
              metadata={"format": "pt"})
    tokenizer.save_pretrained(directory)


@contextlib.contextmanager
def _host_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (so other processes of this host wait for one build rather than each
    building); where the filesystem has no locks, go on without: place_dir keeps concurrent builds safe."""
    fd = None
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def builtin_model_dir(name: str) -> Path:
    """The directory of built-in model `name`, built on first use (seconds for llama-tiny, about half a minute
    and 0.54 GB for llama-135m)."""
    if name not in BUILTIN_CAUSAL:
        raise CoreCPUError(f"unknown built-in model {name!r}; use one of: {', '.join(BUILTIN_CAUSAL)}")
    target = envvars.cache_dir() / "models" / f"{name}-v{VERSION}"
    if (target / "config.json").is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with _host_lock(target.parent / f".{target.name}.lock"):
            if not (target / "config.json").is_file():  # not built while this process waited
                atomic.clean(target)  # the temporaries of builders that were killed
                tmp = atomic.temp_path(target)
                try:
                    tmp.mkdir()
                    _write(name, tmp)
                    atomic.place_dir(tmp, target)  # False: another host's build won, and it is the same
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)  # a build that failed; placed or lost, it is gone
    except OSError as exc:
        raise CoreCPUError(f"cannot build the built-in model {name} in {target.parent} ({os_problem(exc, target)}); "
                           f"set {envvars.CACHE_DIR} to a writable directory") from None
    if not (target / "config.json").is_file():
        raise CoreCPUError(f"{target} is not a complete model directory (no config.json); delete it and run again")
    return target


__all__ = ["BUILTIN_CAUSAL", "CausalShape", "is_builtin_causal", "builtin_model_dir", "causal_config",
           "train_tokenizer", "build_model"]
