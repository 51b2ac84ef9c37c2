"""What run.wrap() makes, in the order it must be made, and the record of it.

    precision (settled on the loader's shapes, agreed by every rank)
    -> attention kernel, sdpa or eager (timed on the model at those shapes, agreed by every rank)
    -> resume from the checkpointer, into the plain model and optimizer
    -> ipex.optimize -> a forward that autocasts and uses the chosen dropout kernel -> torch.compile
    -> the word embedding's gradient kept between steps (corecpu.compute.embedding_grad)
    -> DDP with the chosen gradient path
       (the word embedding's gradient, where sparse_rows applies, outside DDP's buckets: its touched rows)
       or, every rank on one host, no DDP: the optimizer sharded through shared memory (shared_adamw)

`Wrapped` is that result, frozen; wrap() creates it once and the run's steps read it (the model whose
gradients they sync, the checkpointer they save through on a stop signal, the resume position).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Generic, Sequence, TypeVar

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from corecpu.compute import attention_mask, ipex as _ipex
from corecpu.compute.attention import (AttentionChoice, agree_attention, agreed_ratio, generates,
                                      remember_attention, resolve_attention, switchable)
from corecpu.compute.dropout import DropoutChoice, with_dropout
from corecpu.compute.first_token import LastLayerChoice
from corecpu.compute.frozen_casts import FrozenCastChoice
from corecpu.compute.embedding_grad import EmbeddingGradChoice, install as recycle_embedding_grad
from corecpu.compute.precision import CalibrationShapes, PrecisionChoice, decide_precision, resolve_precision
from corecpu.compute.wrappers import unwrap
from corecpu.cpu.hardware import read_cpu_features
from corecpu.distributed import grad_sink, row_step
from corecpu.distributed.process_group import broadcast_from_rank0, gather_objects
from corecpu.distributed.shard_choice import ShardChoice
from corecpu.distributed.shared_adamw import SharedAdamW
from corecpu.distributed.sparse_rows import SparseChoice, SparseRows, decide as decide_sparse
from corecpu.errors import CoreCPUError
from corecpu.training.checkpoint_state import LoopState
from corecpu.training.checkpointer import Checkpoints
from corecpu.training.clipping import GradientClipper

# torch 2.13 renamed DDP's broadcast_buffers (deprecated) to forward_sync_buffers; IPEX 2.8 needs torch 2.8.
_DDP_HAS_FORWARD_SYNC = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
DEFAULT_SHAPE = (16, 64)  # (batch, tokens) calibrated when no loader says better: a typical fine-tuning batch

T = TypeVar("T")


@dataclass(frozen=True)
class Wrapped:
    """What wrap() made: read by the steps, by `run.model` / `run.precision` / `run.resumed`."""

    model: torch.nn.Module  # DDP, compiled, IPEX as applied
    precision: PrecisionChoice  # settled on the model's shapes and agreed across ranks
    checkpoints: Checkpoints | None
    sparse: SparseChoice = SparseChoice("off", "single process")  # the word embedding's rows (sparse_rows)
    sparse_rows: SparseRows | None = None  # its reducer when on
    attention: AttentionChoice = AttentionChoice("unchanged", "not decided")  # the kernel training runs with
    dropout: DropoutChoice = DropoutChoice("torch", "not decided")  # the dropout kernel inside the forward
    last_layer: LastLayerChoice = LastLayerChoice("full", "not decided")  # a classifier's last layer at token 0 only
    clipper: GradientClipper | None = None  # run.clip_grad_norm_: the model's gradients, the optimizer wrap() returned
    embedding_grad: EmbeddingGradChoice = EmbeddingGradChoice("torch", "not decided")  # the word embedding's backward
    shard: ShardChoice = ShardChoice("off", "not decided")  # the optimizer sharded through shared memory, or DDP
    shared: SharedAdamW | None = None  # its step when on
    frozen_casts: FrozenCastChoice = FrozenCastChoice("off", "not decided")  # frozen Linear weights cast once

    @property
    def resumed(self) -> LoopState | None:
        return self.checkpoints.resumed if self.checkpoints is not None else None

    @property
    def agree_max(self) -> Callable[[int], int] | None:
        """The ranks' largest of an int without the process group, where the step has shared memory to do it in
        (the stop check between steps); None: ask the process group."""
        return self.shared.agree_max if self.shared is not None else None

    @property
    def sum_all(self) -> Callable[[Sequence[float]], list[float]] | None:
        """A few numbers summed over the ranks through the step's shared memory; None: ask the process group."""
        return self.shared.sum_all if self.shared is not None else None


class Once(Generic[T]):
    """A value set exactly once (by its one writer), read any number of times: wrap()'s result."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._value: T | None = None

    def set(self, value: T) -> T:
        if self._value is not None:
            raise CoreCPUError(f"{self._what} was called before in this run; call it once")
        self._value = value
        return value

    def get(self) -> T | None:
        return self._value


def calibration_shape(model: torch.nn.Module, loader: DataLoader | None) -> tuple[int, int]:
    """(batch, tokens per example) to time the precisions on: what run.loader() recorded on `loader`, else
    its batch size with a typical fine-tuning length for sequence models (1 row for anything else)."""
    shape = getattr(loader, "corecpu_shape", None) if loader is not None else None
    batch, seq = shape if shape is not None else (
        (loader.batch_size or DEFAULT_SHAPE[0]) if loader is not None else DEFAULT_SHAPE[0], None)
    if seq is None:
        seq = DEFAULT_SHAPE[1] if hasattr(unwrap(model), "config") else 1
    return batch, seq


def measure_precision(requested: str, model: torch.nn.Module, shape: tuple[int, int], threads: int) -> PrecisionChoice:
    """This rank's precision for `model` (no collective). auto: AMX means bf16; elsewhere the model's own
    shapes are timed in both precisions (once per CPU model and shape, then cached)."""
    features = read_cpu_features()
    try:
        return resolve_precision(requested, features, CalibrationShapes.from_model(unwrap(model), *shape), threads)
    except CoreCPUError as exc:
        if requested != "auto":
            return decide_precision(requested, features)
        # nothing bf16 could speed up (no Linear layers): fp32, and say why
        return PrecisionChoice("fp32", f"no shapes to calibrate bf16 on ({exc})".split(";")[0] + ")", source="measured")


def measure_attention(requested: str, model: torch.nn.Module, shape: tuple[int, int], precision: PrecisionChoice,
                      threads: int, agree: Callable[[AttentionChoice], list[AttentionChoice]],
                      dropout: DropoutChoice, room: int | None = None) -> AttentionChoice:
    """The attention kernel for `model` (see corecpu.compute.attention): this rank's timing, `agree` (every rank's
    choice, a collective for more than one), then the agreed ratio cached where this rank timed afresh. `room`: the
    bytes eager attention's scores may take on this rank (None: unknown)."""
    args = (unwrap(model), read_cpu_features(), shape[0], shape[1], precision.name == "bf16", threads)
    mine = resolve_attention(requested, *args, store=False, dropout=dropout.name, room=room)
    everyone = agree(mine)
    if mine.source == "measured" and (ratio := agreed_ratio(everyone)) is not None:
        remember_attention(ratio, *args, dropout=dropout.name)
    return agree_attention(everyone)


def apply_attention(model: torch.nn.Module, choice: AttentionChoice, dtype: torch.dtype | None = None) -> None:
    """Switch the plain model's attention to the agreed kernel (before DDP, compile and IPEX see it). A causal LM on
    eager attention gets its packed batches' bool masks as numbers in `dtype` (the autocast dtype; None: fp32)."""
    plain = unwrap(model)
    if choice.name in ("sdpa", "eager") and switchable(plain) not in (None, choice.name):
        plain.set_attn_implementation(choice.name)
    if generates(plain) and getattr(getattr(plain, "config", None), "_attn_implementation", None) == "eager":
        attention_mask.add_bool_masks_as_numbers(plain, dtype or torch.float32)


def wrap_model(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, scheduler: Any, *,
               precision: PrecisionChoice, dropout: DropoutChoice, checkpoint: Checkpoints | None,
               restore: Callable[[Checkpoints], None], use_ipex: bool, compile: bool,
               ddp_hook: Callable[[], Any] | None, sparse_embedding: str = "off",
               wire: str = "fp32", grad_clip: str = "fused", shard: ShardChoice = ShardChoice("off", "not asked"),
               share: Callable[[torch.optim.Optimizer, list[Any]], SharedAdamW] | None = None
               ) -> tuple[Wrapped, torch.optim.Optimizer | None]:
    """Apply the steps in the module docstring's order. `restore(checkpoint)` loads the resume point into the
    plain model and optimizer; `ddp_hook()` (None for one process) gives the gradient path to register.
    `shard` on (shm): `share(optimizer, row sources)` makes the shared step instead of DDP (decided on the plain model).
    `sparse_embedding` auto|on|off: the word embedding's touched rows outside DDP (sparse_rows), sent as `wire`.
    `grad_clip` fused|torch: where the clipper applies its scale (corecpu.training.clipping)."""
    if checkpoint is not None:
        restore(checkpoint)
    if use_ipex:
        if optimizer is None:
            raise CoreCPUError("ipex.optimize for training needs the optimizer; pass it to wrap(), or ipex='off'")
        model, optimizer = _ipex.optimize(model, optimizer, scheduler, precision)
    if precision.autocast_dtype is not None:  # on the user's module, so unwrap(model) autocasts too
        model.forward = _autocasting(model.forward)  # type: ignore[method-assign]
    model.forward = with_dropout(model.forward, dropout)  # type: ignore[method-assign]
    if compile:
        # Dynamic: padded lengths change from batch to batch; bucketed lengths keep shapes few anyway.
        model = torch.compile(model, dynamic=True)  # type: ignore[assignment]
    embedding_grad, recycled = recycle_embedding_grad(unwrap(model), compile=compile, use_ipex=use_ipex)
    sparse, rows, shared = SparseChoice("off", "single process"), None, None
    if shard.name == "shm" and share is not None and optimizer is not None:
        # No DDP: rank 0's trained weights reach every rank through the shared buffers, its buffers and frozen
        # weights by broadcast (as DDP's construction does), and no gradient is all-reduced.
        _broadcast_untrained(model)
        shared = share(optimizer, [recycled] if recycled else [])
        model.register_forward_pre_hook(shared.attach_grads)  # after zero_grad(set_to_none=True)
        if precision.autocast_dtype is not None and not compile:  # bf16 weight gradients written over the buffers
            grad_sink.install(unwrap(model), shared)
        sparse = SparseChoice("off", "the optimizer is sharded through shared memory: no all-reduce")
    elif ddp_hook is not None:
        # Broadcasting buffers costs a collective before every forward; only running statistics
        # (batch norm) change during training, and only they need rank 0's copy each step.
        # Gradients written straight into the all-reduce buckets save a copy of every gradient.
        sync = {"forward_sync_buffers" if _DDP_HAS_FORWARD_SYNC else "broadcast_buffers": _has_running_stats(model)}
        _keep_frozen_weights_shared(model)
        sparse, weight = decide_sparse(sparse_embedding, unwrap(model))
        if weight is not None:  # its gradient goes by the rows touched, not in DDP's buckets
            _ignore_in_ddp(model, [n for n, p in model.named_parameters() if p is weight])
        model = DistributedDataParallel(model, gradient_as_bucket_view=True, **sync)  # broadcasts rank 0's weights
        ddp_hook().register(model)  # mpi, shm: corecpu's hook on one comm thread; gloo, ccl: DDP's own
        if weight is not None:
            # Under torch.compile the lookup's hooks would run inside the graph: find the rows by scanning there.
            lookup = None if compile else unwrap(model).get_input_embeddings()
            rows = SparseRows(weight, wire, embedding=lookup,  # broadcasts rank 0's embedding too
                              written=recycled.mark_written if recycled else None).attach(model)
    elif recycled is not None and optimizer is not None and row_step.steppable(optimizer):
        row_step.OneProcessRowStep(optimizer, recycled)  # one process: the embedding's unwritten rows only decayed
    if checkpoint is not None:
        checkpoint.attach(model, optimizer, scheduler)
    return Wrapped(model=model, precision=precision, checkpoints=checkpoint, sparse=sparse, sparse_rows=rows,
                   dropout=dropout, clipper=GradientClipper(model.parameters(), optimizer,
                                                            [s for s in (rows, recycled) if s], grad_clip,
                                                            shared=shared),
                   embedding_grad=embedding_grad, shard=shard, shared=shared), optimizer


def _keep_frozen_weights_shared(model: torch.nn.Module) -> None:
    """Collective: let DDP skip its start-up broadcast of frozen parameters when every rank already holds the same.

    transformers maps a safetensors file's weights straight from the page cache (copy-on-write), so the ranks
    of one host share one copy of a frozen base (LoRA) until something writes into it; DDP's broadcast of rank
    0's values would write every page and give each rank a private copy. Skipped only where a checksum of the
    frozen values agrees on every rank (they came from the same file and seed); else DDP broadcasts as usual."""
    frozen = [(n, p) for n, p in model.named_parameters() if not p.requires_grad]
    if not frozen:
        return
    if _agree_on_every_rank([p for _, p in frozen]):  # reading pages shares them; writing would not
        _ignore_in_ddp(model, [n for n, _ in frozen])


def _agree_on_every_rank(tensors: list[torch.Tensor]) -> bool:
    """Collective: whether every rank holds the same values of `tensors`, by checksum (sum and 2-norm)."""
    with torch.no_grad():
        checksum = [(float(t.sum(dtype=torch.float64)), float(torch.linalg.vector_norm(t))) for t in tensors]
    return len({tuple(c) for c in gather_objects(checksum)}) == 1


def _broadcast_untrained(model: torch.nn.Module) -> None:
    """Collective: rank 0's buffers and frozen weights on every rank, as DDP's construction broadcasts them;
    frozen weights whose checksums already agree on every rank are left as they are (shared pages)."""
    frozen = [p for p in model.parameters() if not p.requires_grad]
    broadcast_from_rank0([*model.buffers(), *([] if _agree_on_every_rank(frozen) else frozen)])


def _ignore_in_ddp(model: torch.nn.Module, names: list[str]) -> None:
    """Add `names` to the parameters DDP leaves alone (torch's setter replaces the list; this adds to it)."""
    before = list(getattr(model, "_ddp_params_and_buffers_to_ignore", ()))
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, before + names)


def _has_running_stats(model: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.modules.batchnorm._NormBase) and m.track_running_stats
               for m in model.modules())


def _autocasting(forward: Callable[..., Any]) -> Callable[..., Any]:
    """`forward` under bf16 autocast: the user never writes autocast around a forward (Fabric does the same).
    Eager attention's padding mask is built in bf16 there too (corecpu.compute.attention_mask)."""
    attention_mask.install()

    @functools.wraps(forward)
    def autocast_forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16), attention_mask.masks_in_autocast_dtype():
            return forward(*args, **kwargs)
    return autocast_forward
