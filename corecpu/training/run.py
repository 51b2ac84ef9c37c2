"""The front door: `run = corecpu.setup()` decides everything about the machine once.

    with corecpu.setup() as run:
        loader = run.loader(dataset, batch_size=16, seed=0)
        ckpt = corecpu.Checkpoints("runs/mine", every=100)
        model, opt = run.wrap(model, opt, loader=loader, checkpoint=ckpt)
        for step in run.steps(loader, epochs=3, grad_accum=2):
            for x, y in step.micro_batches():
                step.backward(loss_fn(model(x), y))          # the wrapped forward autocasts
            opt.step(); opt.zero_grad(set_to_none=True)
            ckpt.save(step)

setup() (training/connector.py) detects the launcher once, gives this rank its threads and CPUs (the plan
`corecpu.bind` makes, computed at most once), creates the process group (or uses the one Ray Train made), and resolves
the backend, the gradient all-reduce path and IPEX. wrap() owns the order the rest needs: it settles the
precision on the loader's shapes, resumes from the checkpointer, then applies IPEX,
torch.compile and DDP, and makes the model's forward autocast. Any `torch.nn.Module` and
map-style `Dataset` work.

The `Run` is frozen: who this rank is and every choice made for it, with its reason. What changes
while it runs has its own owner, each one writer:
    Lifetime   (training/lifetime.py)   what to release at close, the rendezvous store: setup(), on_close()
    LoopClock  (training/loop_clock.py) the step in progress, the watchdog, untimed seconds: Steps
    Wrapped    (training/wrapping.py)   the wrapped model, the settled precision, the checkpointer: wrap(), once
    Checkpoints                         the resume position, what was saved: its own methods
    RunLog     (training/run_log.py)    where run.log() records go: on_log() (corecpu.log_to, train.py's reporter)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator, Mapping, Sequence

import torch
from torch.utils.data import DataLoader, Dataset

from corecpu.cluster.launchers import LaunchInfo
from corecpu.compute.attention import AttentionChoice, scores_room
from corecpu.compute.dropout import DropoutChoice, decide_dropout, has_dropout, uses_gradient_checkpointing
from corecpu.compute import frozen_casts
from corecpu.compute.first_token import apply_first_token
from corecpu.compute.precision import PrecisionChoice, agree_precision, typical_batch_length
from corecpu.compute.wrappers import unwrap
from corecpu.cpu.cpulist import format_cpu_list
from corecpu.cpu.hardware import Extension
from corecpu.cpu.node_plan import NodePlan
from corecpu.data.sampling import EvalShardSampler, train_sampler
from corecpu.distributed import process_group as _pg
from corecpu.distributed.allreduce import GradientAllreduce, make_gradient_allreduce
from corecpu.distributed.host_copy import host_copy
from corecpu.distributed.shard_choice import decide as decide_shard, unsupported as unsupported_shard
from corecpu.distributed.shared_adamw import SharedAdamW
from corecpu.distributed.shm_sync import SUM_SLOTS
from corecpu.distributed.sparse_rows import SparseChoice
from corecpu.errors import CoreCPUError
from corecpu.reliability import preempt, watchdog
from corecpu.training.checkpoint_state import LoopState
from corecpu.training.checkpointer import Checkpoints
from corecpu.training.lifetime import Lifetime
from corecpu.training.loop_clock import LoopClock
from corecpu.training.memory_budget import node_budget
from corecpu.training.run_log import RunLog
from corecpu.training.run_options import RunOptions
from corecpu.training.schedule import Schedule
from corecpu.training.steps import Steps, no_sync
from corecpu.training.wrapping import (Once, Wrapped, apply_attention, calibration_shape, measure_attention,
                                       measure_precision, wrap_model)


@dataclass(frozen=True, slots=True)  # slots: not even object.__setattr__ can add a side-car
class Run:
    """One rank's view of the job and every choice made for it. Create with `corecpu.setup()`."""

    launch: LaunchInfo  # who this rank is: rank, world size, local rank, the launcher and its facts
    options: RunOptions
    backend: str  # "none" for one process
    backend_reason: str
    threads: int
    threads_reason: str
    cpus: tuple[int, ...]
    allreduce: str  # "none", "gloo", "ccl" (DDP's own, on that process group) or "mpi"
    allreduce_reason: str
    ipex: Extension | None  # None: not asked for (ipex="off")
    master: str  # "host:port" of the rendezvous, "" for one process
    bindings: tuple[Mapping[str, Any], ...] = ()  # every rank's CPUs and threads, as seen inside it (topology.json)
    binding: str = "none"  # "core" | "numa" (corecpu pinned the rank), "launcher" (someone else did) or "none"
    binding_reason: str = ""
    ranks_reason: str = ""  # `auto`: the launcher's measured choice of ranks per node (CORECPU_RANKS_DECISION)
    requested_precision: PrecisionChoice | None = None  # fp32 or bf16 as asked (None: auto, settled by wrap())
    allocator: str = "glibc"  # the malloc in force and, for glibc's under auto, how to get tcmalloc
    # The owners of what changes while the run goes on (see the module docstring); never reassigned.
    _node: NodePlan | None = dataclasses.field(default=None, repr=False, compare=False)
    _measured_path: GradientAllreduce | None = dataclasses.field(default=None, repr=False, compare=False)
    _life: Lifetime = dataclasses.field(default_factory=Lifetime, repr=False, compare=False)
    _clock: LoopClock = dataclasses.field(default_factory=lambda: LoopClock(watchdog.NullWatchdog), repr=False,
                                          compare=False)
    _wrapped: Once[Wrapped] = dataclasses.field(default_factory=lambda: Once("wrap()"), repr=False, compare=False)
    _log: RunLog = dataclasses.field(default_factory=RunLog, repr=False, compare=False)

    # ------------------------------------------------------------ who am I
    @property
    def rank(self) -> int:
        return self.launch.rank

    @property
    def world_size(self) -> int:
        return self.launch.world_size

    @property
    def local_rank(self) -> int:
        return self.launch.local_rank

    @property
    def is_main(self) -> bool:
        return self.launch.rank == 0

    @property
    def precision(self) -> PrecisionChoice | None:
        """The precision in force; None until wrap() settles 'auto'."""
        wrapped = self._wrapped.get()
        return wrapped.precision if wrapped else self.requested_precision

    @property
    def uses_ipex(self) -> bool:
        return self.ipex is not None and self.ipex.usable

    @property
    def model(self) -> torch.nn.Module | None:
        """The model wrap() returned (DDP, compiled, IPEX as applied); None before wrap()."""
        wrapped = self._wrapped.get()
        return wrapped.model if wrapped else None

    @property
    def step(self) -> int:
        """The optimizer step in progress (or last done, between steps); 0 before the first."""
        return self._clock.step

    @property
    def resumed(self) -> LoopState | None:
        """Where the checkpoint wrap() resumed from left off; None for a fresh start."""
        wrapped = self._wrapped.get()
        return wrapped.resumed if wrapped else None

    @property
    def sparse_embedding(self) -> SparseChoice:
        """Whether the word embedding's gradient is all-reduced by the rows touched, and why; settled by wrap()."""
        wrapped = self._wrapped.get()
        if wrapped is not None:
            return wrapped.sparse
        if self.world_size < 2 or self.options.sparse_embedding_allreduce == "off":
            return SparseChoice("off", "single process" if self.world_size < 2 else "requested")
        return SparseChoice(self.options.sparse_embedding_allreduce, "settled when the model is wrapped")

    @property
    def waited_s(self) -> float | None:
        """Seconds this rank has waited so far, inside the shared optimizer step, for slower ranks; None where
        that is not measured (one rank, or DDP: its waits hide inside the all-reduce)."""
        wrapped = self._wrapped.get()
        return wrapped.shared.waited_s if wrapped is not None and wrapped.shared is not None else None

    def describe(self) -> dict[str, str]:
        """Every resolved choice and why, for the start-up lines, config.json and checkpoints."""
        p = self.precision
        return {
            "launcher": f"{self.launch.label}: rank {self.rank} of {self.world_size}, "
                        f"local rank {self.local_rank} of {self.launch.local_world_size}",
            "ranks": f"{self.launch.local_world_size} per node ({self.ranks_reason or 'as the launcher was asked'})",
            "backend": f"{self.backend} ({self.backend_reason})",
            "allreduce": f"{self.allreduce} ({self.allreduce_reason})",
            "precision": f"{p.name} ({p.reason})" if p else f"{self.options.precision} (settled when the model is wrapped)",
            "threads": f"{self.threads} ({self.threads_reason})",
            "cpus": format_cpu_list(self.cpus),
            "binding": f"{self.binding} ({self.binding_reason})",
            "allocator": self.allocator,
            "ipex": ("off" if self.ipex is None else
                     f"{'ipex.optimize' if self.ipex.usable else 'not used'} ({self.ipex.reason})"),
            "compile": "torch.compile" if self.options.compile else "off",
            "attention": str(self.attention),
            "dropout": str(self.dropout),
            "last_layer": str(wrapped.last_layer) if (wrapped := self._wrapped.get()) else
                          f"{self.options.last_layer} (settled when the model is wrapped)",
            "sparse_embedding_allreduce": str(self.sparse_embedding),
            "grad_clip": (wrapped.clipper.describe() if (wrapped := self._wrapped.get()) and wrapped.clipper
                          else f"{self.options.grad_clip} (settled when the model is wrapped)"),
            "embedding_grad": str(wrapped.embedding_grad) if wrapped else "settled when the model is wrapped",
            "frozen_casts": str(wrapped.frozen_casts) if wrapped else "settled when the model is wrapped",
            "shard_optimizer": (str(wrapped.shard) if wrapped
                                else f"{self.options.shard_optimizer} (settled when the model is wrapped)"),
        }

    def banner(self) -> list[str]:
        """Two start-up lines a person reads: who runs where, and how it computes (after wrap())."""
        p = self.precision
        ipex = ("off" if self.ipex is None else f"ipex.optimize applied ({p.name if p else '?'}); {self.ipex.reason}"
                if self.ipex.usable else self.ipex.reason)
        wrapped = self._wrapped.get()
        grads = (f"gradient all-reduce {self.allreduce} ({self.allreduce_reason})"
                 if wrapped is None or wrapped.shard.name != "shm" else
                 f"no gradient all-reduce: optimizer sharded through shared memory ({wrapped.shard.reason})")
        return [f"corecpu {self.world_size} rank(s) via {self.launch.label}; backend {self.backend} "
                f"({self.backend_reason}); {grads}",
                f"precision {self.describe()['precision']}; {self.threads} thread(s) per rank ({self.threads_reason}); "
                f"ipex: {ipex}; compile {'on' if self.options.compile else 'off'}; attention {self.attention}; "
                f"dropout {self.dropout.name}; allocator {self.allocator}"]

    def resolved(self) -> dict[str, Any]:
        """The machine-dependent choices as plain values: a resume compares them with the checkpoint's."""
        p = self.precision
        return {"backend": self.backend, "allreduce": self.allreduce, "threads": self.threads,
                "precision": p.name if p else None, "bf16_speedup": p.bf16_speedup if p else None,
                "source": p.source if p else None, "ipex": self.uses_ipex, "world_size": self.world_size,
                "binding": self.binding, "sparse_embedding_allreduce": self.sparse_embedding.name,
                "attention": self.attention.name, "dropout": self.dropout.name}

    # ------------------------------------------------------------ model
    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None, *,
             loader: DataLoader | None = None,
             checkpoint: Checkpoints | None = None) -> tuple[torch.nn.Module, torch.optim.Optimizer | None]:
        """In this order: settle the precision and then the attention kernel on `loader`'s shapes, resume from
        `checkpoint` into the plain model and optimizer, then ipex.optimize (where usable), torch.compile (if
        asked), DDP with the chosen gradient all-reduce (more than one rank), and a forward that autocasts.
        IPEX replaces the optimizer; a scheduler passed here is pointed at the new one. Once per run."""
        if self._wrapped.get() is not None:
            raise CoreCPUError("wrap() was called before in this run; wrap one model once")
        # First: the precision and attention timings then run the model as it will train.
        last_layer = apply_first_token(model, self.options.last_layer)
        precision = self.decide_precision(model, loader)
        dropout = self._dropout_for(model)
        attention = self.decide_attention(model, loader, precision, dropout)
        apply_attention(model, attention, precision.autocast_dtype)
        # Resolved choices as they stand once the precision is settled: what a resume compares.
        resolved = {**self.resolved(), "precision": precision.name, "bf16_speedup": precision.bf16_speedup,
                    "source": precision.source, "attention": attention.name, "dropout": dropout.name}
        shard = decide_shard(self.options.shard_optimizer, unsupported_shard(
            optimizer, model, world=self.world_size, local_world=self.launch.local_world_size, use_ipex=self.uses_ipex,
            named=self.options.named_ddp_choice()))
        wrapped, optimizer = wrap_model(
            model, optimizer, scheduler, precision=precision, dropout=dropout, checkpoint=checkpoint,
            restore=lambda ckpt: ckpt.restore(model, optimizer, scheduler, resolved=resolved, is_main=self.is_main,
                                              untimed=self._clock.untimed),
            use_ipex=self.uses_ipex, compile=self.options.compile,
            ddp_hook=self._gradient_path if self.world_size > 1 else None,
            sparse_embedding=self.options.sparse_embedding_allreduce, wire=self.options.allreduce_dtype,
            grad_clip=self.options.grad_clip, shard=shard, share=self._shared_step)
        # A LoRA run's frozen base: cast to bf16 once, not by autocast in every forward.
        frozen = frozen_casts.install(unwrap(wrapped.model), precision.autocast_dtype, compile=self.options.compile,
                                      use_ipex=self.uses_ipex, local_ranks=self.launch.local_world_size,
                                      budget=node_budget, share=functools.partial(
                                          host_copy, rank=self.rank, gather=self.gather, barrier=self.barrier))
        self._wrapped.set(dataclasses.replace(wrapped, attention=attention, last_layer=last_layer, frozen_casts=frozen))
        return wrapped.model, optimizer

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """clip_grad_norm_ on the wrapped model: the norm before clipping; with fused AdamW applied in its next step."""
        wrapped = self._wrapped.get()
        if wrapped is None or wrapped.clipper is None:
            raise CoreCPUError("clip_grad_norm_() clips the wrapped model's gradients: call run.wrap() first")
        return wrapped.clipper(max_norm)

    def _shared_step(self, optimizer: torch.optim.Optimizer, rows: Sequence[Any]) -> SharedAdamW:
        """The optimizer step sharded through shared memory (collective; every rank on this host)."""
        return SharedAdamW(optimizer, rank=self.rank, world=self.world_size, barrier=_pg.barrier,
                           sum_scalar=lambda x: _pg.all_reduce_sum([x])[0],
                           share_tag=lambda tag: _pg.gather_objects(tag)[0], rows=rows)

    def _gradient_path(self) -> GradientAllreduce:
        """The path setup() measured and kept, else a new one of the chosen kind (released at close)."""
        if self._measured_path is not None:
            return self._measured_path
        path = make_gradient_allreduce(self.allreduce, self.launch, self._node, self.options.allreduce_dtype)
        self._life.on_close(path.close)
        return path

    def decide_precision(self, model: torch.nn.Module, loader: DataLoader | None = None) -> PrecisionChoice:
        """The precision for `model` (wrap() settles it with this). A collective for more than one rank.
        fp32 as asked; auto: AMX means bf16, elsewhere the model's own shapes (`loader`'s, see
        run.loader()) are timed in both precisions (once per CPU model and shape, then cached). Every rank measures
        on its own cores; bf16 only if every rank found it faster."""
        if self.options.precision == "fp32" and self.requested_precision is not None:
            return self.requested_precision
        choice = measure_precision(self.options.precision, model, calibration_shape(model, loader), self.threads)
        return agree_precision(self.gather(choice)) if self.world_size > 1 else choice

    def decide_attention(self, model: torch.nn.Module, loader: DataLoader | None,
                         precision: PrecisionChoice, dropout: DropoutChoice | None = None) -> AttentionChoice:
        """sdpa or eager attention for `model` (wrap() settles it with this). A collective for more than one rank:
        every rank times both on its own cores, and eager is kept only if every rank found it faster."""
        local = self.launch.local_world_size
        return measure_attention(self.options.attention, model, calibration_shape(model, loader), precision,
                                 self.threads, agree=self.gather if self.world_size > 1 else lambda c: [c],
                                 dropout=dropout or self._dropout_for(model),
                                 room=scores_room(local, *node_budget(local)))

    def _dropout_for(self, model: torch.nn.Module) -> DropoutChoice:
        return decide_dropout(self.options.dropout, self.options.compile, uses_gradient_checkpointing(model),
                              has_dropout(model))

    @property
    def dropout(self) -> DropoutChoice:
        """The dropout kernel inside the wrapped forward, and why; settled by wrap()."""
        wrapped = self._wrapped.get()
        return wrapped.dropout if wrapped is not None else DropoutChoice(
            self.options.dropout, "settled when the model is wrapped")

    @property
    def attention(self) -> AttentionChoice:
        """The attention kernel training runs with, and why; settled by wrap()."""
        wrapped = self._wrapped.get()
        return wrapped.attention if wrapped is not None else AttentionChoice(
            self.options.attention, "settled when the model is wrapped")

    def autocast(self) -> ContextManager:
        """bf16 autocast where the precision is bf16, else nothing: for computations outside the wrapped
        model's forward. fp32 and bf16 are settled at setup(), auto when the model is wrapped."""
        p = self.precision
        if p is None:
            raise CoreCPUError("autocast() before wrap(): precision 'auto' is settled when the model is wrapped")
        return torch.autocast("cpu", dtype=torch.bfloat16) if p.name == "bf16" else contextlib.nullcontext()

    @staticmethod
    def no_sync(model: torch.nn.Module | None, sync: bool) -> ContextManager:
        """For gradient accumulation: skip the all-reduce on every micro-step but the last (sync=True).
        run.steps() does this for you."""
        return no_sync(model, sync)

    # ------------------------------------------------------------ data
    def loader(self, dataset: Dataset, batch_size: int, *, shuffle: bool = True, seed: int = 0,
               collate_fn: Callable | None = None, drop_last: bool = False,
               lengths: Sequence[int] | None = None) -> DataLoader:
        """A DDP loader for a map-style dataset: every rank gets its shard and the same number of batches
        (the sampler pads with duplicates, as DistributedSampler does). Pass `lengths` to batch examples
        of similar length together (the ranks of one step get similar lengths too). run.steps() sets the
        epoch and the resume position; in a loop of your own call `loader.sampler.set_epoch(epoch)`."""
        if batch_size < 1:
            raise CoreCPUError(f"batch_size must be at least 1, got {batch_size}")
        sampler = train_sampler(dataset, batch_size, self.rank, self.world_size, seed, shuffle, lengths)
        loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate_fn, drop_last=drop_last)
        # What wrap(loader=) times the precisions on: this batch size and its typical padded length.
        loader.corecpu_shape = (batch_size, typical_batch_length(lengths, batch_size) if lengths else None)
        return loader

    def eval_loader(self, dataset: Dataset, batch_size: int, *, collate_fn: Callable | None = None,
                    lengths: Sequence[int] | None = None) -> DataLoader:
        """Evaluation: each rank its strided shard, no duplicates counted. Every rank runs the same number of
        batches; filler items carry valid=False (weight metrics by it) and all-reduce the sums. With `lengths`
        (tokens per example) each shard runs longest first, so batches carry little padding."""
        if batch_size < 1:
            raise CoreCPUError(f"batch_size must be at least 1, got {batch_size}")
        sampler = EvalShardSampler(dataset, self.world_size, self.rank, False, 0, batch_size, lengths)
        return DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate_fn)

    def steps(self, loader: DataLoader, *, epochs: int | None = None, max_steps: int = 0, grad_accum: int = 1) -> Steps:
        """The optimizer steps over `loader` (see corecpu.training.steps): `epochs` passes, or `max_steps`
        (whichever ends first; epochs None: as many as max_steps needs). `.total` is their number, known
        before the loop (for an LR schedule). Iterate after wrap(): it resumes where the checkpoint left off."""
        if epochs is None:
            if max_steps < 1:
                raise CoreCPUError("run.steps() needs epochs, max_steps or both")
            epochs = -(-max_steps // Schedule.for_loader(loader, grad_accum).steps_per_epoch)
        if not preempt.installed() and _main_thread():  # a stop signal saves instead of killing the loop
            preempt.install(announce=self.is_main)
            self.on_close(preempt.uninstall_unless_stopping)
        return Steps(loader, Schedule.for_loader(loader, grad_accum, epochs, max_steps), clock=self._clock,
                     wrapped=self._wrapped.get, is_main=self.is_main, world_size=self.world_size,
                     sum_over_ranks=self.all_reduce_sum)

    @contextlib.contextmanager
    def evaluating(self, model: torch.nn.Module) -> Iterator[None]:
        """Evaluation mode without gradients, not timed by the watchdog; training mode again after."""
        model.eval()
        try:
            at = f" at step {self._clock.step}" if self._clock.step else ""
            with self.untimed(f"evaluation{at}", kind="eval"), torch.no_grad():
                yield
        finally:
            model.train()

    # ------------------------------------------------------------ collectives
    def all_reduce_sum(self, values: Sequence[float]) -> list[float]:
        """Sum a few numbers over all ranks (float64; a copy for one process). Through the shared step's memory
        where it has some (one host: a few microseconds against milliseconds over gloo, see shm_sync)."""
        wrapped = self._wrapped.get()
        shared = wrapped.sum_all if wrapped is not None else None
        if shared is not None and len(values) <= SUM_SLOTS:
            return shared(list(values))
        return _pg.all_reduce_sum(list(values))

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's picklable `obj`, in rank order, on every rank."""
        return _pg.gather_objects(obj)

    def barrier(self) -> None:
        _pg.barrier()

    def print0(self, *args: Any, **kwargs: Any) -> None:
        """print() on rank 0 only, flushed (ranks' output goes through the launcher's pipes)."""
        if self.is_main:
            print(*args, **{"flush": True, **kwargs})

    @contextlib.contextmanager
    def agreeing(self) -> Iterator[None]:
        """Every rank runs the body; if it fails with a CoreCPUError on any rank, it fails on all of them,
        so one rank's bad file stops the job with its message instead of leaving the others in a collective."""
        failed: CoreCPUError | None = None
        try:
            yield
        except CoreCPUError as exc:
            failed = exc
        if self.all_reduce_sum([0.0 if failed is None else 1.0])[0] > 0:
            raise failed or CoreCPUError("another rank failed during set-up (its error is above)")

    # ------------------------------------------------------------ stopping well
    def should_stop(self) -> int:
        """Collective, at an optimizer-step boundary: the stop signal (SIGTERM/SIGINT/SIGUSR1) any rank got,
        or 0; the same answer on every rank. run.steps() asks this between steps."""
        wrapped = self._wrapped.get()
        return preempt.stop_requested_everywhere(wrapped.agree_max if wrapped is not None else None)

    def untimed(self, phase: str, kind: str = "other") -> ContextManager[None]:
        """A phase no step predicts (evaluation, a checkpoint write): the watchdog does not time it, but a
        rank that stops during it (its heartbeat stands still) is still named and the job ended. Its duration
        is added to `untimed_seconds[kind]`, for the run's phase split in summary.json."""
        return self._clock.untimed(phase, kind)

    @property
    def untimed_seconds(self) -> dict[str, float]:
        """Seconds spent so far in untimed phases, by kind ("eval", "checkpoint", ...)."""
        return self._clock.seconds()

    # ------------------------------------------------------------ records
    def log(self, values: Mapping[str, Any], step: int | None = None) -> None:
        """A record of your loop's values at `step` (default: the step in progress, run.step), e.g.
        `run.log({"loss": loss, "learning_rate": lr})`: to metrics.jsonl and the trackers, by rank 0 (on other
        ranks it does nothing; reduce first what differs between ranks). Under train.py it goes where train.py's
        records go; in a loop of your own attach them once: `corecpu.log_to(run, "runs/mine", report_to="tensorboard")`.
        A tensor is read with .item() (a host sync): call this on log steps only."""
        self._log.write(values, self._clock.step if step is None else step)

    def on_log(self, write: Callable[[Mapping[str, Any], int], None]) -> None:
        """Call `write(record, step)` for each run.log() record (corecpu.log_to and train.py's reporter do)."""
        self._log.attach(write)

    def on_close(self, fn: Callable[[], None]) -> None:
        """Call `fn` when the run closes (last registered, first called), whatever ends it."""
        self._life.on_close(fn)

    # ------------------------------------------------------------ teardown
    def close(self) -> None:
        """Release the all-reduce thread, the watchdog and the process group. Safe to call twice."""
        try:
            self._life.close(teardown=_pg.teardown)
        finally:
            preempt.release_after_stop()  # a stopped run ignored stop signals through its teardown

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
