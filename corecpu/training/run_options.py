"""How a run computes and communicates: the options `corecpu.setup()` takes and `TrainConfig` nests.

One dataclass, one help string per field, each choice tuple defined once (in the subpackage
that acts on it), validated once at the edge. Errors name the option in library terms
(`precision`); the command line names the flag (`--precision`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from corecpu.compute import ATTENTION_CHOICES, DROPOUT_CHOICES, IPEX_CHOICES, LAST_LAYER_CHOICES, PRECISIONS
from corecpu.cpu.sharing import BINDING_CHOICES
from corecpu.distributed import ALLREDUCE_CHOICES, ALLREDUCE_DTYPES, BACKENDS, SPARSE_EMBEDDING_CHOICES
from corecpu.distributed.shard_choice import SHARD_CHOICES
from corecpu.errors import CoreCPUError
from corecpu.training.clipping import GRAD_CLIP_CHOICES


def opt(default: Any, help: str, choices: tuple[str, ...] | None = None, metavar: str | None = None, *,
        defines_run: bool = False) -> Any:
    """A dataclass field with what the command line needs: a default, a help text, its choices. `defines_run`:
    a resume with another value trains a different run, so the start-up names the change."""
    return field(default=default, metadata={"help": help, "choices": choices, "metavar": metavar,
                                            "defines_run": defines_run})


@dataclass(frozen=True)
class RunOptions:
    precision: str = opt("auto", "auto: bf16 autocast if the CPU has AMX or bf16 measured >= 1.1x fp32 "
                         "for this model (timed once per CPU, cached in ~/.cache/corecpu), else fp32",
                         choices=PRECISIONS, defines_run=True)
    backend: str = opt("auto", "auto: ccl if oneccl_bindings_for_pytorch matches torch, else gloo", choices=BACKENDS)
    allreduce: str = opt("auto", "gradient all-reduce: auto (every path that can run here is timed on one 25 MB "
                         "bucket at start-up, cached per kind of machine, and the fastest kept), gloo, mpi "
                         "(Intel MPI via mpi4py, ranks started by MPI), ccl, "
                         "shm (DeepSpeed's shared-memory op inside a host, hierarchical across hosts; "
                         "pip install 'corecpu[shm]', built once per environment in ~1 min)",
                         choices=ALLREDUCE_CHOICES)
    allreduce_dtype: str = opt("fp32", "what gradients travel as: fp32, or bf16 (half the bytes; rounds each "
                               "rank's gradient to bf16 before summing; shm, gloo, ccl; MPI has no bf16 sum)",
                               choices=ALLREDUCE_DTYPES, defines_run=True)
    sparse_embedding_allreduce: str = opt("auto", "all-reduce only the input word embedding's rows some rank "
                                          "touched, not the whole tensor (same sums; MiniLM: about half the bytes "
                                          "per step); auto: where that embedding is trainable, untied and has at "
                                          "least 4096 rows", choices=SPARSE_EMBEDDING_CHOICES)
    shard_optimizer: str = opt("auto", "auto: with every rank on one host, no DDP all-reduce: gradients accumulate "
                               "in /dev/shm, each rank sums a 1/N slice over the ranks and runs the fused AdamW "
                               "step on that slice of weights and moments kept once in /dev/shm (DDP where it "
                               "cannot: ranks on several hosts, another optimizer, IPEX, too little /dev/shm, or a "
                               "DDP choice named: --backend, --allreduce, --grad-clip torch...); shm: that or an "
                               "error; off: DDP", choices=SHARD_CHOICES)
    attention: str = opt("auto", "attention kernel of a Hugging Face model: sdpa (transformers' default), eager, or "
                         "auto: each timed on one training step of the model at the loader's batch shape (once per "
                         "CPU, cached) and eager kept only where it was at least 1.03x as fast", choices=ATTENTION_CHOICES)
    dropout: str = opt("fast", "dropout kernel inside the wrapped forward: fast (16 random bits an element from a hash "
                       "on every thread, p rounded to 1/65536; 1.7x torch's dropout) or torch "
                       "(torch's own random stream); torch.compile keeps its own", choices=DROPOUT_CHOICES,
                       defines_run=True)
    last_layer: str = opt("auto", "auto: a BERT-style (or DistilBERT) sequence classifier's last encoder layer "
                          "computes only the first token, the one its head reads (same logits and gradients; "
                          "MiniLM: a seventh fewer matmul FLOPs), checked against the full layer on the model at "
                          "start-up; full: every position", choices=LAST_LAYER_CHOICES)
    grad_clip: str = opt("fused", "where run.clip_grad_norm_ applies its scale: fused (inside torch's fused AdamW "
                         "step, one pass over the gradients fewer; equal to torch's clip up to rounding) or torch "
                         "(torch.nn.utils.clip_grad_norm_ itself, bit for bit)", choices=GRAD_CLIP_CHOICES)
    compile: bool = opt(False, "apply torch.compile to the model (measured slower than eager: MiniLM at one "
                        "thread a rank, BERT-base at two (0.90x), plus minutes of compiling; benchmarks/README.md)")
    ipex: str = opt("auto", "auto: ipex.optimize when intel_extension_for_pytorch matches torch; off: never",
                    choices=IPEX_CHOICES)
    threads: int = opt(0, "compute threads per rank (0: this rank's cores, as bound by the launcher or planned here)")
    binding: str = opt("auto", "core: pin each rank to its own cores; numa: let each rank run anywhere on its NUMA "
                       "node (same threads); auto: core (measured no slower than numa, also beside a busy "
                       "neighbour), with the evidence of sharing found at launch recorded", choices=BINDING_CHOICES)
    dist_timeout: float = opt(120.0, "seconds to wait for all ranks at start-up before failing with a clear error")
    step_timeout: float = opt(300.0, "after the first step, seconds without progress from any rank before the job "
                              "ends naming the ranks that stopped (raised to several times the slowest step seen)")

    def named_ddp_choice(self) -> str:
        """The first choice made by name that only DDP's gradients honour (so `shard_optimizer auto` keeps DDP):
        a backend, a gradient path, a wire dtype, the sparse embedding rows, torch's clip bit for bit."""
        for name, default in (("backend", "auto"), ("allreduce", "auto"), ("allreduce_dtype", "fp32"),
                              ("sparse_embedding_allreduce", "auto"), ("grad_clip", "fused")):
            value = getattr(self, name)
            if value != default and not (name == "sparse_embedding_allreduce" and value == "off"):
                return f"--{name.replace('_', '-')} {value}"
        return ""

    def validate(self, flags: bool = False) -> "RunOptions":
        """One CoreCPUError line for the first bad option; `flags` names them as command-line flags."""
        def name(f: str) -> str:
            return "--" + f.replace("_", "-") if flags else f

        for f in dataclasses.fields(self):
            choices, value = f.metadata["choices"], getattr(self, f.name)
            if choices and value not in choices:
                raise CoreCPUError(f"{name(f.name)} {value!r} is not one of: {', '.join(choices)}"
                                   if flags else f"{f.name} must be one of {', '.join(choices)}, got {value!r}")
        if self.threads < 0:
            raise CoreCPUError(f"{name('threads')} must be 0 (this rank's cores) or positive, got {self.threads}")
        for f in ("dist_timeout", "step_timeout"):
            value = getattr(self, f)
            if not (value > 0 and math.isfinite(value)):
                raise CoreCPUError(f"{name(f)} must be a positive number of seconds, got {value}")
        return self
