"""Which attention kernel a Hugging Face model trains with: torch's SDPA or the model's eager attention, by measurement.

transformers loads models with `attn_implementation="sdpa"`. In training, with attention dropout, torch's CPU SDPA
cannot use its fused kernel and runs its math fallback: the same two matmuls, softmax and dropout as the eager
attention, plus a safe-softmax pass over the scores (`all`, `where`) and separate scaling of queries and keys.
On a 2-vCPU Xeon with AMX that fallback made a MiniLM step about 7% slower than eager attention (one rank per core,
bf16, the paraphrase set). Whether it does depends on the CPU, the thread count and the shapes, so `auto` times both
on the loader's batch shape (below) and keeps eager only where it was at least MARGIN faster. The ratio is cached per
CPU, torch and transformers version, model shape, batch shape, precision and thread count, like the precision
calibration (corecpu.compute.precision).

Evaluation runs with the same kernel: one model, one kernel, so evaluation computes what training learned with.

What is timed is one training forward and backward of the model's first attention layer, on the inputs a forward of
the model gives it under each kernel. The whole model was timed until December 2026: for a LoRA run of a
Llama-3.2-1B-shaped model (4 x 128 tokens, one thread a rank, 2-vCPU Xeon with AMX) that took 51 s of start-up and
read eager at 0.99x, inside the noise of 7-s steps, so SDPA stayed; the layer timing takes 2-3 s and reads eager at
1.33-1.60x, and the job's steps ran 5.3-5.4 s against 6.0-6.6 s with eager forced (the same loss). At those shapes
torch's CPU flash kernel took 88 ms a layer forward and backward, eager attention 37 (bf16, one thread). A model
with no such layer is timed whole, as before. Eager attention keeps each layer's softmax output for its backward,
which SDPA's fused kernel does not: where those scores would not fit in a quarter of a rank's share of the memory
(eager_scores_bytes, scores_room) SDPA is kept without a timing, as at long sequence lengths.

Causal LMs are switched too. Their training batches carry corecpu's (B, 1, T, T) bool mask for packed documents,
which SDPA takes with an explicit mask: on CPU its flash kernel's backward then dominated a LoRA step of llama-135m
(646 of 4,048 ms under the profiler, 30 layers at 4 x 128 tokens, one thread of a 2-vCPU AMX Xeon), and eager
attention trained the same step 1.23x faster (2,172 against 2,670 ms, interleaved medians; losses 11.29208 against
11.29229). So for them the timing runs on such a mask, and eager attention gets it in its additive form
(corecpu.compute.attention_mask.add_bool_masks_as_numbers). Generation builds its own masks for either kernel.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from corecpu import cachefile, envvars, notices
from corecpu.compute import ATTENTION_CHOICES
from corecpu.cpu.hardware import CpuFeatures
from corecpu.errors import CoreCPUError

MARGIN = 1.03  # eager must beat SDPA by this much: within run-to-run noise the library's default stays
# Warm-up steps longer than this: two timed rounds (one in each order), not three. One round (one step of each, sdpa
# first) read eager at 0.83x, 0.91x and 1.25x in three 2-rank LoRA jobs of llama-135m on one 2-vCPU Xeon, where a
# one-process run read 1.27x: a VM's speed can move by more between two single steps than the kernels differ.
LONG_STEP_S = 4.0
# A first step longer than this is not timed further: the kernel stays as transformers chose it (a large causal LM at
# a long length could otherwise spend minutes of start-up here). --attention eager|sdpa chooses without a timing.
MAX_TIMED_STEP_S = 30.0
# Of a rank's share of the host's memory, what eager attention's scores may take: the weights, the other activations
# and the allocator's slack need the rest.
SCORES_SHARE = 0.25
# Rows the whole model is timed on where no attention layer can be (16 took 5.4 s for MiniLM on one Xeon core).
WHOLE_MODEL_BATCH = 4
# One attention layer is timed in alternating rounds: at least this many, more while the budget lasts.
LAYER_MIN_ROUNDS = 3
LAYER_MAX_ROUNDS = 20
LAYER_BUDGET_S = 1.0
CACHE_FILE = "attention.json"
# 2: the dropout kernel is part of the key (fast dropout makes eager relatively faster); 3: one attention layer timed,
# not the whole model (a whole-model ratio of an earlier version is not reused).
CACHE_VERSION = 3
KEY_FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile", "avx512f", "avx2")


@dataclass(frozen=True)
class AttentionChoice:
    """The attention kernel training uses, and why: config.json's `decisions` entry and the banner."""

    name: str  # "sdpa" | "eager" | "unchanged" (the model has no switchable attention)
    reason: str
    sdpa_over_eager: float | None = None  # SDPA step time / eager step time, when measured (or cached)
    source: str = "requested"  # "requested" | "measured" | "cached" | "model" | "memory"

    def __str__(self) -> str:
        return f"{self.name} ({self.reason})"


def switchable(model: Any) -> str | None:
    """The model's current attention kernel when corecpu may switch it between sdpa and eager, else None: a model
    with an SDPA path (not an image model, whose config also says "eager")."""
    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if current not in ("sdpa", "eager") or not callable(getattr(model, "set_attn_implementation", None)):
        return None
    if not getattr(model, "_supports_sdpa", False):
        return None
    return current


def generates(model: Any) -> bool:
    """A causal LM: its training batches carry corecpu's 4-D packed-document masks (corecpu.data.packing)."""
    can_generate = getattr(model, "can_generate", None)
    decoder = getattr(getattr(model, "config", None), "is_decoder", False)
    return bool(decoder or (callable(can_generate) and can_generate()))


def decide_attention(requested: str, current: str | None, sdpa_over_eager: float | None = None, *,
                     cached: bool = False, margin: float = MARGIN) -> AttentionChoice:
    """Pure: the kernel for a model now on `current`, given the measured ratio (None: not measured)."""
    if requested not in ATTENTION_CHOICES:
        raise CoreCPUError(f"attention must be one of {', '.join(ATTENTION_CHOICES)}, got {requested!r}")
    if current is None:
        if requested != "auto":
            raise CoreCPUError(f"--attention {requested}: this model has no sdpa/eager attention to choose between; "
                               "use --attention auto")
        return AttentionChoice("unchanged", "the model has no sdpa/eager attention switch", source="model")
    if requested != "auto":
        return AttentionChoice(requested, "requested")
    if sdpa_over_eager is None:
        return AttentionChoice(current, "not measured", source="model")
    where = "cached" if cached else "measured"
    if sdpa_over_eager >= margin:
        return AttentionChoice("eager", f"{where}: {sdpa_over_eager:.2f}x faster than sdpa on this model",
                               sdpa_over_eager, where)
    return AttentionChoice("sdpa", f"{where}: eager {sdpa_over_eager:.2f}x sdpa, under {margin:.2f}x",
                           sdpa_over_eager, where)


def agree_attention(choices: list[AttentionChoice]) -> AttentionChoice:
    """Every rank trains with one kernel: eager only where every rank measured it faster, else the first other."""
    return next((c for c in choices if c.name != "eager"), choices[0])


def agreed_ratio(choices: list[AttentionChoice]) -> float | None:
    """What the ranks' timings amount to: the smallest ratio (eager wins only if it wins on every rank). The cache
    keeps this, not each rank's own, so a later run reading it decides as this one agreed: ranks writing their own
    ratios to one cache entry would leave the last writer's, and a ratio near MARGIN could flip the next run."""
    ratios = [c.sdpa_over_eager for c in choices if c.sdpa_over_eager is not None]
    return min(ratios) if ratios else None


def eager_scores_bytes(config: Any, batch: int, seq: int, bf16: bool) -> int:
    """Pure: the memory eager attention needs beyond SDPA's in a training step of `batch` rows of `seq` tokens. Eager
    attention keeps each layer's softmax output (fp32) for the backward, and under bf16 autocast also the bf16
    probabilities its value matmul saves: batch x heads x seq x seq values each, every layer, with one layer's scores
    in flight on top. SDPA's fused CPU kernel keeps none of them. With attention dropout SDPA runs its math fallback
    on CPU, which keeps as much, so eager needs nothing more: 0."""
    from corecpu.compute.dropout import config_attention_dropout  # imports torch: this module loads without it

    if config_attention_dropout(config) > 0:
        return 0
    heads = int(getattr(config, "num_attention_heads", 0) or getattr(config, "n_head", 0) or 1)
    layers = int(getattr(config, "num_hidden_layers", 0) or getattr(config, "n_layer", 0) or 1)
    kept, in_flight = (6, 12) if bf16 else (4, 16)  # bytes a score: kept per layer; scores, scaled, masked, softmax
    return (layers * kept + in_flight) * batch * heads * seq * seq


def scores_room(local_ranks: int, limit: int | None, available: int | None) -> int | None:
    """Pure: the bytes eager attention's scores may take on a rank: SCORES_SHARE of the tightest known memory budget
    of the host (a cgroup's limit, the memory available), split between its ranks; None where neither is known."""
    budgets = [b for b in (limit, available) if b is not None]
    return int(SCORES_SHARE * min(budgets) / max(local_ranks, 1)) if budgets else None


def _gb(n: float) -> str:
    return f"{n / 1024 ** 3:.1f} GB"


class TooLongToTime(RuntimeError):
    """The timing's first step took longer than it may (MAX_TIMED_STEP_S)."""


def _timing_inputs(model: Any, batch: int, seq: int, bf16: bool) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Random ids (batch x seq, inside the model's positions and vocabulary), the attention mask each kernel is given
    in training, and the extra forward arguments of a causal LM (its logits at the last position only)."""
    import torch

    from corecpu.compute.attention_mask import additive  # imports torch: this module loads without it

    embedding = model.get_input_embeddings() if callable(getattr(model, "get_input_embeddings", None)) else None
    vocab = int(getattr(embedding, "num_embeddings", 0) or getattr(model.config, "vocab_size", 0) or 1000)
    positions = getattr(model.config, "max_position_embeddings", None)
    seq = min(seq, positions) if isinstance(positions, int) and positions > 0 else seq
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(min(5, vocab - 1), vocab, (batch, seq), generator=g)
    masks: dict[str, Any] = {"sdpa": torch.ones_like(ids), "eager": torch.ones_like(ids)}
    extra: dict[str, Any] = {}
    if generates(model):
        causal = torch.ones(seq, seq, dtype=torch.bool).tril().expand(batch, 1, seq, seq)
        masks = {"sdpa": causal, "eager": additive(causal, torch.bfloat16 if bf16 else torch.float32)}
        base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
        if "logits_to_keep" in inspect.signature(type(base).forward).parameters:
            extra["logits_to_keep"] = 1
    return ids, masks, extra


@contextlib.contextmanager
def _timing_state(model: Any) -> Iterator[None]:
    """Inside: the model in training mode, the random stream forked; after: its weights' gradients, mode, kernel and
    the random stream as they were."""
    import torch

    before = {"training": model.training, "kernel": model.config._attn_implementation,
              "grads": {p: p.grad for p in model.parameters()}}
    try:
        with torch.random.fork_rng(devices=[]):  # dropout here must not shift the training run's random stream
            model.train()
            yield
    finally:
        model.set_attn_implementation(before["kernel"])
        model.train(before["training"])
        for p, grad in before["grads"].items():
            p.grad = grad


def _thread_clock() -> Callable[[], float]:
    import torch
    return time.thread_time if torch.get_num_threads() <= 1 else time.perf_counter


def _round_order(r: int) -> tuple[str, str]:
    """The kernels' order in timed round r: alternating, so a host speeding up or slowing down favours neither."""
    return ("sdpa", "eager") if r % 2 == 0 else ("eager", "sdpa")


def measure_sdpa_over_eager(model: Any, batch: int, seq: int, bf16: bool, dropout: str = "torch",
                            rounds: int = 3, max_step_s: float = MAX_TIMED_STEP_S) -> float:
    """SDPA time / eager time of one training forward and backward of the whole `model` on random ids (batch x seq),
    rounds alternating the order, with the dropout kernel training uses (eager's dropout is the fast one where chosen;
    SDPA draws its own): the timing of a model with no attention layer measure_layer_sdpa_over_eager finds. A causal
    LM gets the causal 4-D bool mask its packed batches carry, in the form each kernel is given it in training, and
    its logits at the last position only (the head's work is the same for both kernels). Raises TooLongToTime when
    the first step takes more than `max_step_s`. The model's weights, gradients, mode, kernel and the random stream
    are as they were."""
    import torch

    from corecpu.compute.dropout import dropout_context  # imports torch too

    clock = _thread_clock()
    with _timing_state(model):
        ids, masks, extra = _timing_inputs(model, batch, seq, bf16)

        def one(kernel: str) -> float:
            model.set_attn_implementation(kernel)
            start = clock()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16), dropout_context(dropout):
                out = model(input_ids=ids, attention_mask=masks[kernel], **extra)
            logits = out.logits if hasattr(out, "logits") else out[0]
            logits.float().sum().backward()
            for p in model.parameters():
                p.grad = None
            return clock() - start

        first = one("sdpa")  # first calls pick kernels and grow the allocator
        if first > max_step_s:
            raise TooLongToTime(f"one step took {first:.0f} s")
        warm = first + one("eager")
        rounds = rounds if warm < LONG_STEP_S else min(rounds, 2)  # a large model: four more steps
        times: dict[str, list[float]] = {"sdpa": [], "eager": []}
        for r in range(rounds):
            for kernel in _round_order(r):
                times[kernel].append(one(kernel))
        return statistics.median(times["sdpa"]) / statistics.median(times["eager"])


def attention_layer(model: Any) -> Any | None:
    """The model's first attention layer that takes its kernel from the config at each call (transformers'
    ALL_ATTENTION_FUNCTIONS under `config._attn_implementation`: LlamaAttention, BertSelfAttention, ...), else None."""
    for module in model.modules():
        code = getattr(inspect.unwrap(type(module).forward), "__code__", None)
        if code is not None and {"ALL_ATTENTION_FUNCTIONS", "_attn_implementation"} <= set(code.co_names):
            return module
    return None


_CACHE_ARGUMENTS = ("cache", "past_key_values", "past_key_value", "layer_past")


class _Reached(Exception):
    """Raised by the hook that records a layer's inputs: the rest of the model's forward is not needed."""


def _inputs_of(layer: Any, forward: Callable[[], Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The positional and keyword arguments `layer` is called with in `forward()`, which stops there."""
    seen: dict[str, Any] = {}

    def record(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        seen.update(args=args, kwargs=kwargs)
        raise _Reached

    handle = layer.register_forward_pre_hook(record, with_kwargs=True)
    try:
        forward()
    except _Reached:
        pass
    finally:
        handle.remove()
    if "args" not in seen:
        raise RuntimeError("the model's forward did not reach its attention layer")
    # A key/value cache (a model whose config has use_cache on) would grow by a call's keys at every timed call.
    return seen["args"], {k: None if k in _CACHE_ARGUMENTS else v for k, v in seen["kwargs"].items()}


def _fresh_hidden(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The recorded arguments with the hidden states a new leaf that wants a gradient, as in training (the
    backward through the attention to the layer's input is part of what the kernels differ in)."""
    if "hidden_states" in kwargs:
        return args, {**kwargs, "hidden_states": kwargs["hidden_states"].detach().requires_grad_()}
    return (args[0].detach().requires_grad_(), *args[1:]), kwargs


def measure_layer_sdpa_over_eager(model: Any, batch: int, seq: int, bf16: bool, dropout: str = "torch",
                                  budget_s: float = LAYER_BUDGET_S, max_step_s: float = MAX_TIMED_STEP_S) -> float:
    """SDPA time / eager time of one training forward and backward of the model's first attention layer
    (attention_layer), on the arguments a forward of the model on random ids (batch x seq) gives it under each kernel:
    its mask in that kernel's form, a causal LM's packed-document mask as in measure_sdpa_over_eager. The layer is
    where the kernels differ, and it costs a fraction of the model's step, so this times alternating rounds (at least
    LAYER_MIN_ROUNDS, more while `budget_s` lasts) in a few seconds where the whole model took 51 s for a
    1B-parameter LoRA run, and the ratio is not diluted by the rest of the step. Raises LookupError for a model with
    no such layer, TooLongToTime when the first call takes more than `max_step_s`. The model's weights, gradients,
    mode, kernel and the random stream are as they were."""
    import torch

    from corecpu.compute.dropout import dropout_context  # imports torch too

    layer = attention_layer(model)
    if layer is None:
        raise LookupError("no attention layer that takes its kernel from the config")
    clock = _thread_clock()
    with _timing_state(model):
        ids, masks, _ = _timing_inputs(model, batch, seq, bf16)

        def autocast() -> Any:
            return torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)

        inputs = {}
        for kernel in ("sdpa", "eager"):
            model.set_attn_implementation(kernel)
            with torch.no_grad(), autocast(), dropout_context(dropout):
                inputs[kernel] = _inputs_of(layer, lambda: model(input_ids=ids, attention_mask=masks[kernel]))

        def one(kernel: str) -> float:
            model.set_attn_implementation(kernel)
            args, kwargs = _fresh_hidden(*inputs[kernel])
            start = clock()
            with autocast(), dropout_context(dropout):
                out = layer(*args, **kwargs)
            (out[0] if isinstance(out, tuple) else out).float().sum().backward()
            elapsed = clock() - start
            for p in layer.parameters():
                p.grad = None
            return elapsed

        first = one("sdpa")  # first calls pick kernels and grow the allocator
        if first > max_step_s:
            raise TooLongToTime(f"one attention layer took {first:.0f} s")
        one("eager")
        times: dict[str, list[float]] = {"sdpa": [], "eager": []}
        began = time.perf_counter()
        rounds = 0
        while rounds < LAYER_MIN_ROUNDS or (rounds < LAYER_MAX_ROUNDS and time.perf_counter() - began < budget_s):
            for kernel in _round_order(rounds):
                times[kernel].append(one(kernel))
            rounds += 1
        return statistics.median(times["sdpa"]) / statistics.median(times["eager"])


def measure_attention_kernels(model: Any, batch: int, seq: int, bf16: bool, dropout: str = "torch") -> float:
    """SDPA time / eager time: on the model's first attention layer at the training batch where it has one, else on
    the whole model at WHOLE_MODEL_BATCH rows at most (each row does the same work, so the ratio holds)."""
    try:
        return measure_layer_sdpa_over_eager(model, batch, seq, bf16, dropout)
    except LookupError:
        return measure_sdpa_over_eager(model, min(batch, WHOLE_MODEL_BATCH), seq, bf16, dropout)


def cache_key(features: CpuFeatures, versions: str, threads: int, model: Any, batch: int, seq: int,
              bf16: bool, dropout: str = "torch") -> str:
    from corecpu.compute import first_token  # imports torch: this module loads without it

    config = model.config
    shape = {k: getattr(config, k, None) for k in ("model_type", "hidden_size", "num_attention_heads",
                                                   "num_hidden_layers", "intermediate_size",
                                                   "attention_probs_dropout_prob", "attention_dropout")}
    what_key: dict[str, Any] = {"model": shape, "class": type(model).__name__, "batch": batch, "seq": seq}
    if first_token.is_first_token(first_token.last_layer(model)):
        what_key["last_layer"] = "first-token"  # other work timed; other models' keys stay as they were
    what = json.dumps(what_key, sort_keys=True)
    flags = ",".join(f for f in KEY_FLAGS if f in features.flags)
    return (f"{features.model_name} | {flags} | {versions} | {threads} threads | {'bf16' if bf16 else 'fp32'} | "
            f"{dropout} dropout | shapes {hashlib.sha256(what.encode()).hexdigest()[:12]}")


def cached_ratio(path: Path, key: str) -> float | None:
    entry = cachefile.read_entries(path, CACHE_VERSION).get(key) or {}
    ratio = entry.get("sdpa_over_eager")
    return float(ratio) if isinstance(ratio, (int, float)) and 0.05 < ratio < 20 else None


def _cache(model: Any, features: CpuFeatures, batch: int, seq: int, bf16: bool, threads: int,
           cache_dir: Path | None, dropout: str) -> tuple[Path, str]:
    import torch
    import transformers

    key = cache_key(features, f"torch {torch.__version__} transformers {transformers.__version__}", threads, model,
                    batch, seq, bf16, dropout)
    return (cache_dir or envvars.cache_dir()) / CACHE_FILE, key


def remember_attention(ratio: float, model: Any, features: CpuFeatures, batch: int, seq: int, bf16: bool,
                       threads: int, cache_dir: Path | None = None, *, dropout: str = "torch") -> bool:
    """Cache the ratio the ranks agreed on (agreed_ratio) for the next run on this kind of machine."""
    path, key = _cache(model, features, batch, seq, bf16, threads, cache_dir, dropout)
    return cachefile.store_entry(path, CACHE_VERSION, key, {
        "sdpa_over_eager": ratio, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
        what="the attention timing")


def resolve_attention(requested: str, model: Any, features: CpuFeatures, batch: int, seq: int, bf16: bool,
                      threads: int, cache_dir: Path | None = None, *, store: bool = True, dropout: str = "torch",
                      room: int | None = None,
                      measure: Callable[..., float] = measure_attention_kernels) -> AttentionChoice:
    """This rank's choice for `model` (no collective; agree_attention over the ranks). I/O: the cache, the timing.
    `store` False leaves caching a fresh timing to the caller (remember_attention, after the ranks agree). `room`:
    the bytes of memory eager attention's scores may take on this rank (None: unknown); where they would take more
    (eager_scores_bytes), SDPA is kept untimed: a long sequence would otherwise train on eager to the OOM killer."""
    current = switchable(model)
    if requested != "auto" or current is None:
        return decide_attention(requested, current)
    if room is not None and (need := eager_scores_bytes(model.config, batch, seq, bf16)) > room:
        return AttentionChoice("sdpa", f"eager attention would keep {_gb(need)} of attention scores at batch {batch} "
                                       f"x {seq} tokens, more than the {_gb(room)} a rank has for them here "
                                       "(--attention eager forces it)", source="memory")
    path, key = _cache(model, features, batch, seq, bf16, threads, cache_dir, dropout)
    ratio = cached_ratio(path, key)
    if ratio is not None:
        return decide_attention("auto", current, ratio, cached=True)
    start = time.perf_counter()
    with notices.phase(f"timing sdpa against eager attention on this model (batch {batch} x {seq} tokens; "
                       "once per CPU model and shape)"):
        try:
            ratio = measure(model, batch, seq, bf16, dropout)
        except TooLongToTime as exc:
            return AttentionChoice(current, f"kept: {exc}, too long to time at start-up (--attention sdpa|eager "
                                            "chooses without a timing)", source="model")
        except (ValueError, NotImplementedError, RuntimeError, IndexError) as exc:  # a model this timing cannot run
            return AttentionChoice(current, f"kept: timing failed ({type(exc).__name__}: {str(exc)[:80]})",
                                   source="model")
    if store:
        cachefile.store_entry(path, CACHE_VERSION, key, {
            "sdpa_over_eager": ratio, "calibration_s": round(time.perf_counter() - start, 3),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, what="the attention timing")
    return decide_attention("auto", current, ratio)


__all__ = ["ATTENTION_CHOICES", "MAX_TIMED_STEP_S", "AttentionChoice", "TooLongToTime", "agree_attention",
           "agreed_ratio", "attention_layer", "decide_attention", "eager_scores_bytes", "generates",
           "measure_attention_kernels", "measure_layer_sdpa_over_eager", "measure_sdpa_over_eager",
           "remember_attention", "resolve_attention", "switchable"]
