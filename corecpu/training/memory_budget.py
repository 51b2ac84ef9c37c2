"""Will a language-model run fit in this node's memory? Estimated before the first step, refused in one line.

On CPU servers memory, not FLOPs, is what stops a fine-tuning run, and it stops it late: the kernel's
OOM killer ends a rank mid-epoch, or the node swaps. So the causal-LM task estimates, once the model is
mapped (transformers maps a safetensors file lazily: that costs no memory yet) and before anything is
written, what each rank and the node will hold, fp32 throughout:

  weights      the trained parameters (full fine-tuning writes every weight: a private copy per rank);
  shared       a frozen LoRA base, mapped from the page cache once per node (see wrapping.py);
  gradients    one value per trained parameter;  optimizer   AdamW's two moments per trained parameter;
  activations  what the backward keeps per token and layer of a Llama-style block (about 6h + 2kv + 4i
               values; only each layer's input with --gradient-checkpointing, plus one layer's full set),
               and the logits and their gradient (2 x vocabulary values per token: an upper bound, as
               label_logits makes them at label tokens alone);
  runtime      Python, torch, transformers and their libraries (measured at about 0.4-0.6 GB per rank).

It errs high on purpose where it guesses (the runtime, the allocator's slack), and is compared with the
tightest of the cgroup's limit and the memory the kernel says is available.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corecpu.cpu.cgroups import read_memory_limit
from corecpu.errors import CoreCPUError

GB = 1024 ** 3
RUNTIME_BYTES = int(0.6 * GB)
FP32 = 4
MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True)
class ModelShape:
    params: int  # every parameter
    trainable: int  # those with requires_grad
    layers: int
    hidden: int
    kv: int  # key/value width (hidden for plain multi-head attention)
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, model: Any) -> ModelShape:
        config = model.config
        layers = int(getattr(config, "num_hidden_layers", 0) or getattr(config, "n_layer", 0) or 0)
        hidden = int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0) or 0)
        heads = int(getattr(config, "num_attention_heads", 0) or getattr(config, "n_head", 0) or 1)
        kv_heads = int(getattr(config, "num_key_value_heads", 0) or heads)
        inter = int(getattr(config, "intermediate_size", 0) or getattr(config, "n_inner", 0) or 4 * hidden)
        return cls(params=sum(p.numel() for p in model.parameters()),
                   trainable=sum(p.numel() for p in model.parameters() if p.requires_grad),
                   layers=layers, hidden=hidden, kv=hidden * kv_heads // max(heads, 1), intermediate=inter,
                   vocab=int(getattr(config, "vocab_size", 0) or 0))


@dataclass(frozen=True)
class MemoryEstimate:
    shared: int  # per node
    weights: int  # per rank, and the rest too
    gradients: int
    optimizer: int
    activations: int
    runtime: int = RUNTIME_BYTES

    def per_rank(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations + self.runtime

    def per_node(self, local_ranks: int) -> int:
        return self.shared + local_ranks * self.per_rank()

    def describe(self, local_ranks: int) -> str:
        parts = [f"weights {_gb(self.weights)}", f"gradients {_gb(self.gradients)}",
                 f"optimizer {_gb(self.optimizer)}", f"activations {_gb(self.activations)}",
                 f"runtime {_gb(self.runtime)}"]
        shared = f" + a frozen base of {_gb(self.shared)} shared" if self.shared else ""
        return (f"about {_gb(self.per_node(local_ranks))} per node: {local_ranks} rank(s) x {_gb(self.per_rank())} "
                f"({', '.join(parts)}){shared}")


def estimate(shape: ModelShape, *, batch: int, seq: int, lora: bool, checkpointing: bool) -> MemoryEstimate:
    """Pure: the memory a rank (and the node) needs for one micro-batch of `batch` rows of `seq` tokens."""
    tokens = batch * seq
    per_layer = (6 * shape.hidden + 2 * shape.kv + 4 * shape.intermediate) * FP32 * tokens
    kept = (shape.layers * shape.hidden * FP32 * tokens + per_layer) if checkpointing else shape.layers * per_layer
    logits = 2 * shape.vocab * FP32 * tokens
    frozen = shape.params - shape.trainable
    return MemoryEstimate(shared=frozen * FP32 if lora else 0,
                          weights=(shape.trainable if lora else shape.params) * FP32,
                          gradients=shape.trainable * FP32, optimizer=2 * shape.trainable * FP32,
                          activations=kept + logits)


def check_fits(est: MemoryEstimate, local_ranks: int, *, limit: int | None, available: int | None, lora: bool,
               checkpointing: bool) -> None:
    """One line naming what to change when the node cannot hold the run; nothing when it can, or when
    neither a limit nor the available memory is known."""
    budgets = [(b, w) for b, w in ((limit, "the cgroup's memory limit"), (available, "the memory available on this "
                                   "host")) if b is not None]
    if not budgets:
        return
    budget, where = min(budgets)
    need = est.per_node(local_ranks)
    if need <= budget:
        return
    fixes = []
    if not lora:
        fixes.append("train LoRA adapters (--lora-r 16)")
    if not checkpointing and est.activations > est.per_rank() / 4:
        fixes.append("--gradient-checkpointing")
    fixes.append("a smaller --batch-size or --max-seq-len")
    if local_ranks > 1:
        fixes.append("fewer ranks per node")
    raise CoreCPUError(f"this run needs {est.describe(local_ranks)}, but {where} is {_gb(budget)}; use "
                       f"{', '.join(fixes[:-1]) + ' or ' if len(fixes) > 1 else ''}{fixes[-1]}")


def node_budget(local_ranks: int) -> tuple[int | None, int | None]:
    """(the cgroup's limit, what the host can give this job): MemAvailable plus what the job's ranks already
    hold (their runtime, counted in the estimate too). Reads /sys and /proc."""
    try:
        fields = dict(line.split(":", 1) for line in MEMINFO.read_text().splitlines() if ":" in line)
        available = int(fields["MemAvailable"].split()[0]) * 1024 + local_ranks * RUNTIME_BYTES
    except (OSError, KeyError, ValueError):
        available = None
    return read_memory_limit(), available


def _gb(n: int) -> str:
    return f"{n / GB:.1f} GB" if n >= 0.1 * GB else f"{n / 2**20:.0f} MB"
