"""How close to the machine a run is: model FLOPs utilisation (MFU).

    count = count_flops(model, head_on_labels=...)  # once: what the model's parts cost
    rate = node_matmul_rate("bf16", threads, ...)   # once per machine: what the cores can do (cached)
    flops = count.batch(tokens, attended, label_tokens)   # each micro-batch's useful FLOPs, summed
    mfu = flops / seconds / rate

The count is the usual one (Kaplan et al. 2020; PaLM's appendix B; nanoGPT and torchtitan on GPUs):
a trained token costs 6 x N FLOPs, N the non-embedding parameters (2 forward, 4 backward), plus
12 x layers x width x T for attention's two matmuls (QK^T and AV) over a sequence of T tokens. The
tokens are the real ones, padding excluded, so padded positions count as waste, not as work.
Embedding lookups are no matmul and are left out. Only useful work counts, as MFU's definition asks:
  - attention over each sequence's own tokens: a batch's `attended` is the sum over its sequences of
    length squared, and packed documents are sequences of their own (they attend to nothing else, though
    the dense masked kernel computes the whole row);
  - the output layer only where it runs: at label tokens when the model computes logits only there
    (corecpu.training.label_logits), else at every token;
  - a frozen weight (a LoRA base) 4 FLOPs a token, not 6: it needs no weight gradient;
  - a classifier's last layer computed at its first token only (corecpu.compute.first_token): its keys and
    values at every token, the rest of its weights and its attention at one token a sequence.

The rate is measured, not read off a datasheet: every rank times square matmuls in the run's
precision on its own cores at the same moment (so ranks that share a node share its memory
bandwidth and turbo budget, as in training) and the job's rate is their sum. It is the best of the
repeats, the one least disturbed by anything else the machine ran, and it is cached per kind of
machine, threads, ranks per node, torch version and load state (whether the launcher found the run's CPUs
busy), as the precision calibration and the all-reduce timings are. A cached rate that a run's model then
outruns (MFU above 100%) was measured while something else ran: the run says so and reports no MFU, and the next
run measures again, keeping the higher of the two (`suspect`, below).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from corecpu import cachefile, envvars
from corecpu.compute import first_token
from corecpu.compute.wrappers import unwrap

CACHE_FILE = "matmul.json"
# 2: the best repeat, not the median (a median taken while something else ran was cached low: a 2-thread
# rate below the 1-thread one on the 2-vCPU EPYC)
CACHE_VERSION = 2
MATMUL_SIZE = 1024  # big enough to reach the kernel's rate on a few cores, small enough to take ~0.1 s
REPEATS = 5
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class FlopCount:
    params: int  # non-embedding parameters (an embedding tied to the output layer counts: it is a matmul there)
    layers: int  # attention layers (0: no transformer config found, attention not counted)
    width: int  # hidden size
    frozen: int = 0  # of `params`, those not trained (a LoRA base): no weight gradient, 4 FLOPs a token, not 6
    head: int = 0  # of `params`, the output layer's (0: none found; then it counts with the body)
    head_frozen: int = 0  # of `head`, those not trained
    head_on_labels: bool = False  # the output layer runs at label tokens only (label-only logits)
    first_token: float = 0.0  # FLOPs a token of the last layer's weights that run at one token a sequence (0: none)

    def _body(self) -> float:
        return 6.0 * (self.params - self.frozen - self.head + self.head_frozen) + 4.0 * (self.frozen - self.head_frozen)

    def _head(self) -> float:
        return 6.0 * (self.head - self.head_frozen) + 4.0 * self.head_frozen

    def per_token(self, mean_len: float) -> float:
        """Training FLOPs per real token for sequences of `mean_len` tokens, the head at every token."""
        return self._body() + self._head() + 12.0 * self.layers * self.width * mean_len

    def batch(self, tokens: int, attended: int | None = None, label_tokens: int | None = None,
              samples: int = 1) -> float:
        """A micro-batch's training FLOPs. `attended`: the sum over its sequences (packed documents each
        one) of their real length squared; None: every one of the `samples` rows as long as their mean.
        `label_tokens`: where the loss counts, which is where the head runs when `head_on_labels`."""
        if attended is None:
            attended = tokens * tokens / max(samples, 1)
        head_rows = label_tokens if self.head_on_labels and label_tokens is not None else tokens
        body = self._body() * tokens + self._head() * head_rows
        if not self.first_token:
            return body + 12.0 * self.layers * self.width * attended
        rows = min(samples, tokens)  # the last layer's one query a sequence sees that sequence's tokens
        return (body - self.first_token * (tokens - rows)
                + 12.0 * self.width * ((self.layers - 1) * attended + tokens))


def count_flops(model: torch.nn.Module, head_on_labels: bool = False) -> FlopCount:
    """The model's non-embedding parameters, its output layer's and, from a Hugging Face config, its attention
    shape. `head_on_labels`: the model computes logits only at label tokens."""
    model = unwrap(model)
    # A parameter counts when a module other than an embedding holds it: a tied output layer's weight counts once.
    held = {id(p): p for m in model.modules() if not isinstance(m, torch.nn.Embedding)
            for p in m.parameters(recurse=False)}
    params = sum(p.numel() for p in held.values())
    frozen = sum(p.numel() for p in held.values() if not p.requires_grad)
    output = _output_layer(model)
    head_params = [p for p in output.parameters() if id(p) in held] if output is not None else []
    config = getattr(model, "config", None)
    layers = _first_int(config, ("num_hidden_layers", "n_layer", "num_layers"))
    width = _first_int(config, ("hidden_size", "n_embd", "d_model"))
    return FlopCount(params, layers if width else 0, width if layers else 0, frozen,
                     head=sum(p.numel() for p in head_params),
                     head_frozen=sum(p.numel() for p in head_params if not p.requires_grad),
                     head_on_labels=head_on_labels and bool(head_params),
                     first_token=_first_token_cost(model) if layers and width else 0.0)


def _first_token_cost(model: torch.nn.Module) -> float:
    """FLOPs a token of the weights the last layer runs at its first token only (all but keys and values)."""
    layer = first_token.last_layer(model)
    if not first_token.is_first_token(layer):
        return 0.0
    assert layer is not None
    return float(sum((6 if p.requires_grad else 4) * p.numel() for p in first_token.one_token_params(layer)))


def _output_layer(model: torch.nn.Module) -> torch.nn.Module | None:
    """A language model's output layer (transformers' get_output_embeddings), through a PEFT wrapper."""
    for m in model.modules():
        get = getattr(m, "get_output_embeddings", None)
        if callable(get):
            try:
                layer = get()
            except (AttributeError, NotImplementedError):
                continue
            if isinstance(layer, torch.nn.Module):
                return layer
    return None


def _first_int(config: object, names: Sequence[str]) -> int:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 0


def time_matmul(precision: str, size: int = MATMUL_SIZE, repeats: int = REPEATS,
                clock: Callable[[], float] = time.perf_counter) -> float:
    """FLOP/s of a size^3 matmul in `precision` on this process's threads: the fastest of `repeats`, the one
    least slowed by whatever else ran."""
    dtype = _DTYPES[precision]
    # A generator of its own: the default one is the training run's (dropout), and this measurement runs only
    # when the cache misses, so drawing from it made a first run's losses differ from every later run's.
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(size, size, dtype=dtype, generator=g), torch.randn(size, size, dtype=dtype, generator=g)
    torch.mm(a, b)  # warm-up: kernel choice, page faults
    seconds = []
    for _ in range(repeats):
        start = clock()
        torch.mm(a, b)
        seconds.append(clock() - start)
    return 2.0 * size ** 3 / max(min(seconds), 1e-9)


def cache_key(cpu_model: str, precision: str, threads: int, local_ranks: int, busy: bool = False) -> str:
    """`busy`: the launcher found some of the run's CPUs busy at start. A rate measured beside a neighbour is
    kept apart, so an idle start never divides by it."""
    return (f"{cpu_model}|{precision}|threads={threads}|local_ranks={local_ranks}|torch={torch.__version__}"
            + ("|busy" if busy else ""))


def rank_matmul_rate(precision: str, key: str, cache_dir: Path | None = None,
                     measure: Callable[[str], float] = time_matmul) -> tuple[float, bool]:
    """(this rank's FLOP/s in `precision`, whether it came from the cache). Measured once per key, then cached;
    measured again where a run marked the cached rate suspect, the higher of the two kept."""
    path = (cache_dir or envvars.cache_dir()) / CACHE_FILE
    entry = cachefile.read_entries(path, CACHE_VERSION).get(key, {})
    known = entry.get("flops")
    known = float(known) if isinstance(known, (int, float)) and known > 0 else None
    if known is not None and not entry.get("suspect"):
        return known, True
    rate = max(measure(precision), known or 0.0)
    cachefile.store_entry(path, CACHE_VERSION, key, {"flops": rate, "size": MATMUL_SIZE}, "the matmul rate")
    return rate, False


def suspect(key: str, cache_dir: Path | None = None) -> bool:
    """Mark the cached rate of `key` as measured too low (a run's model outran it): the next run measures it
    again. False when there was no such entry or the cache is not writable."""
    path = (cache_dir or envvars.cache_dir()) / CACHE_FILE
    entry = cachefile.read_entries(path, CACHE_VERSION).get(key)
    if entry is None:
        return False
    return cachefile.store_entry(path, CACHE_VERSION, key, {**entry, "suspect": True}, "the matmul rate")


def mfu(flops_per_s: float, job_flops: float) -> float | None:
    """Model FLOPs utilisation: achieved training FLOP/s over the job's measured matmul rate."""
    if job_flops <= 0 or flops_per_s <= 0:
        return None
    return flops_per_s / job_flops


__all__ = ["FlopCount", "cache_key", "count_flops", "mfu", "rank_matmul_rate", "suspect", "time_matmul"]
