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

setup() detects the launcher once, gives this rank its threads and CPUs (the plan `corecpu.bind`
makes, computed at most once), creates the process group, and resolves the backend, the
gradient all-reduce path and IPEX. wrap() owns the order the rest needs: it settles the
precision on the loader's shapes, resumes from the checkpointer, then applies IPEX,
torch.compile and DDP, and makes the model's forward autocast. Any `torch.nn.Module` and
map-style `Dataset` work.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import inspect
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator, MutableMapping, Sequence

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

from corecpu.cluster.launchers import LaunchInfo, detect_launcher
from corecpu.compute import ipex as _ipex
from corecpu.compute.precision import (CalibrationShapes, PrecisionChoice, agree_precision, decide_precision,
                                       resolve_precision, typical_batch_length)
from corecpu.compute.wrappers import unwrap
from corecpu.cpu import threads as _threads
from corecpu.cpu.cpulist import format_cpu_list
from corecpu.cpu.hardware import Extension, read_cpu_features
from corecpu.cpu.node_plan import NodePlan
from corecpu.data.sampling import EvalShardSampler, train_sampler
from corecpu.distributed import mpi_init
from corecpu.distributed import process_group as _pg
from corecpu.distributed.allreduce import choose_allreduce, make_gradient_allreduce
from corecpu.training import gradient_path
from corecpu.errors import CoreCPUError
from corecpu.reliability import lifeline, preempt, watchdog
from corecpu.training.checkpoint import LoopState
from corecpu.training.checkpointer import Checkpoints
from corecpu.training.options import RunOptions
from corecpu.training.schedule import Schedule
from corecpu.training.steps import Step, Steps

# torch 2.13 renamed DDP's broadcast_buffers (deprecated) to forward_sync_buffers; IPEX 2.8 needs torch 2.8.
_DDP_HAS_FORWARD_SYNC = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
DEFAULT_SHAPE = (16, 64)  # (batch, tokens) calibrated when no loader says better: a typical fine-tuning batch


@dataclass
class _Late:
    """What is settled after setup(): precision, the wrapped model, the resume position; resources to release."""

    precision: PrecisionChoice | None = None
    precision_final: bool = False  # measured/checked on the model's shapes and agreed across ranks
    shape_hint: tuple[int, int | None] | None = None  # (batch, tokens per example) of the last loader
    model: torch.nn.Module | None = None  # the wrapped model: steps() syncs its gradients
    checkpoints: Checkpoints | None = None
    store: Any = None  # the rendezvous store: the watchdog's heartbeats go there
    watchdog: Any = None
    step: int = 0  # the optimizer step the loop body is performing (run.steps() keeps it), for messages
    untimed_seconds: dict[str, float] = field(default_factory=dict)  # time spent per kind of untimed phase
    gradient_allreduce: Any = None  # the path auto measured and kept (else wrap() makes the chosen one)
    closers: list[Callable[[], None]] = field(default_factory=list)
    closed: bool = False


@dataclass(frozen=True)
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
    bindings: tuple[dict[str, Any], ...] = ()  # every rank's CPUs and threads, as seen inside it (topology.json)
    binding: str = "none"  # "core" | "numa" (corecpu pinned the rank), "launcher" (someone else did) or "none"
    binding_reason: str = ""
    _late: _Late = field(default_factory=_Late, repr=False, compare=False)
    _node: NodePlan | None = field(default=None, repr=False, compare=False)

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
        return self._late.precision

    @property
    def uses_ipex(self) -> bool:
        return self.ipex is not None and self.ipex.usable

    @property
    def model(self) -> torch.nn.Module | None:
        """The model wrap() returned (DDP, compiled, IPEX as applied); None before wrap()."""
        return self._late.model

    @property
    def resumed(self) -> LoopState | None:
        """Where the checkpoint wrap() resumed from left off; None for a fresh start."""
        return self._late.checkpoints.resumed if self._late.checkpoints else None

    def describe(self) -> dict[str, str]:
        """Every resolved choice and why, for the start-up lines, config.json and checkpoints."""
        p = self._late.precision
        return {
            "launcher": f"{self.launch.launcher}: rank {self.rank} of {self.world_size}, "
                        f"local rank {self.local_rank} of {self.launch.local_world_size}",
            "backend": f"{self.backend} ({self.backend_reason})",
            "allreduce": f"{self.allreduce} ({self.allreduce_reason})",
            "precision": f"{p.name} ({p.reason})" if p else f"{self.options.precision} (settled when the model is wrapped)",
            "threads": f"{self.threads} ({self.threads_reason})",
            "cpus": format_cpu_list(self.cpus),
            "binding": f"{self.binding} ({self.binding_reason})",
            "ipex": ("off" if self.ipex is None else
                     f"{'ipex.optimize' if self.ipex.usable else 'not used'} ({self.ipex.reason})"),
            "compile": "torch.compile" if self.options.compile else "off",
        }

    def banner(self) -> list[str]:
        """Two start-up lines a person reads: who runs where, and how it computes (after wrap())."""
        p = self._late.precision
        ipex = ("off" if self.ipex is None else f"ipex.optimize applied ({p.name if p else '?'}); {self.ipex.reason}"
                if self.ipex.usable else self.ipex.reason)
        return [f"corecpu {self.world_size} rank(s) via {self.launch.launcher}; backend {self.backend} "
                f"({self.backend_reason}); gradient all-reduce {self.allreduce} ({self.allreduce_reason})",
                f"precision {self.describe()['precision']}; {self.threads} thread(s) per rank ({self.threads_reason}); "
                f"ipex: {ipex}; compile {'on' if self.options.compile else 'off'}"]

    def resolved(self) -> dict[str, Any]:
        """The machine-dependent choices as plain values: a resume compares them with the checkpoint's."""
        p = self._late.precision
        return {"backend": self.backend, "allreduce": self.allreduce, "threads": self.threads,
                "precision": p.name if p else None, "bf16_speedup": p.bf16_speedup if p else None,
                "source": p.source if p else None, "ipex": self.uses_ipex, "world_size": self.world_size,
                "binding": self.binding}

    # ------------------------------------------------------------ model
    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None, *,
             loader: DataLoader | None = None,
             checkpoint: Checkpoints | None = None) -> tuple[torch.nn.Module, torch.optim.Optimizer | None]:
        """In this order: settle the precision on `loader`'s shapes (else the last run.loader()'s), resume from
        `checkpoint` into the plain model and optimizer, then ipex.optimize (where usable), torch.compile (if
        asked), DDP with the chosen gradient all-reduce (more than one rank), and a forward that autocasts.
        IPEX replaces the optimizer; a scheduler passed here is pointed at the new one."""
        if self._late.model is not None:
            raise CoreCPUError("wrap() was called before in this run; wrap one model once")
        precision = self.decide_precision(model, loader)
        if checkpoint is not None:
            self._late.checkpoints = checkpoint
            checkpoint.restore(self, model, optimizer, scheduler)
        if self.uses_ipex:
            if optimizer is None:
                raise CoreCPUError("ipex.optimize for training needs the optimizer; pass it to wrap(), or ipex='off'")
            model, optimizer = _ipex.optimize(model, optimizer, scheduler, precision)
        if precision.autocast_dtype is not None:  # on the user's module, so unwrap(model) autocasts too
            model.forward = _autocasting(model.forward)  # type: ignore[method-assign]
        if self.options.compile:
            # Dynamic: padded lengths change from batch to batch; bucketed lengths keep shapes few anyway.
            model = torch.compile(model, dynamic=True)
        if self.world_size > 1:
            # Broadcasting buffers costs a collective before every forward; only running statistics
            # (batch norm) change during training, and only they need rank 0's copy each step.
            # Gradients written straight into the all-reduce buckets save a copy of every gradient.
            sync = {"forward_sync_buffers" if _DDP_HAS_FORWARD_SYNC else "broadcast_buffers": _has_running_stats(model)}
            model = DistributedDataParallel(model, gradient_as_bucket_view=True, **sync)  # broadcasts rank 0's weights
            # mpi, shm: corecpu's hook on one comm thread; gloo, ccl: DDP's own (torch's bf16 hook for bf16)
            hook = self._late.gradient_allreduce
            if hook is None:
                hook = make_gradient_allreduce(self.allreduce, self.launch, self._node, self.options.allreduce_dtype)
                self._late.closers.append(hook.close)
            hook.register(model)
        if checkpoint is not None:
            checkpoint.attach(model, optimizer, scheduler)
        self._late.model = model
        return model, optimizer

    def decide_precision(self, model: torch.nn.Module, loader: DataLoader | None = None) -> PrecisionChoice:
        """Settle the precision for `model` now (wrap() does it otherwise). A collective for more than one rank.
        auto: AMX means bf16; elsewhere the model's own shapes are timed in both precisions (once per CPU
        model, then cached). Every rank measures on its own cores; bf16 only if every rank found it faster."""
        if self._late.precision_final:
            return self._late.precision  # type: ignore[return-value]
        batch, seq = _shape_of(loader) if loader is not None else self._late.shape_hint or (DEFAULT_SHAPE[0], None)
        if seq is None:  # no lengths known: a typical fine-tuning length for sequence models, 1 row otherwise
            seq = DEFAULT_SHAPE[1] if hasattr(unwrap(model), "config") else 1
        requested, features = self.options.precision, read_cpu_features()
        try:
            shapes = CalibrationShapes.from_model(unwrap(model), batch, seq)
            choice = resolve_precision(requested, features, shapes, self.threads)
        except CoreCPUError as exc:
            if requested != "auto":
                choice = decide_precision(requested, features)
            else:  # nothing bf16 could speed up (no Linear layers): fp32, and say why
                choice = PrecisionChoice("fp32", f"no shapes to calibrate bf16 on ({exc})".split(";")[0] + ")",
                                         source="measured")
        self._late.precision = agree_precision(self.gather(choice)) if self.world_size > 1 else choice
        self._late.precision_final = True
        return self._late.precision

    def autocast(self) -> ContextManager:
        """bf16 autocast where the precision is bf16, else nothing: for computations outside the wrapped
        model's forward. fp32 and bf16 are settled at setup(), auto when the model is wrapped."""
        p = self._late.precision
        if p is None:
            raise CoreCPUError("autocast() before wrap(): precision 'auto' is settled when the model is wrapped")
        return torch.autocast("cpu", dtype=torch.bfloat16) if p.name == "bf16" else contextlib.nullcontext()

    @staticmethod
    def no_sync(model: torch.nn.Module | None, sync: bool) -> ContextManager:
        """For gradient accumulation: skip the all-reduce on every micro-step but the last (sync=True).
        run.steps() does this for you."""
        if sync or not isinstance(model, DistributedDataParallel):
            return contextlib.nullcontext()
        return model.no_sync()

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
        loader.corecpu_shape = (batch_size, typical_batch_length(lengths, batch_size) if lengths else None)
        self._late.shape_hint = loader.corecpu_shape
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
            self.on_close(preempt.uninstall)
        return Steps(self, loader, Schedule.for_loader(loader, grad_accum, epochs, max_steps))

    @contextlib.contextmanager
    def evaluating(self, model: torch.nn.Module) -> Iterator[None]:
        """Evaluation mode without gradients, not timed by the watchdog; training mode again after."""
        model.eval()
        try:
            at = f" at step {self._late.step}" if self._late.step else ""
            with self.untimed(f"evaluation{at}", kind="eval"), torch.no_grad():
                yield
        finally:
            model.train()

    # ------------------------------------------------------------ collectives
    def all_reduce_sum(self, values: Sequence[float]) -> list[float]:
        """Sum a few numbers over all ranks (float64; a copy for one process)."""
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
        return preempt.stop_requested_everywhere()

    def stop_if_signalled(self, step: Step) -> None:
        """Collective, after `step`: on a stop signal every rank saves (through wrap()'s checkpointer) and exits
        75 with one line; without a checkpointer it exits 128+N, nothing saved."""
        if not preempt.installed() or not (signum := self.should_stop()):
            return
        ckpt = self._late.checkpoints
        saved = ckpt.save(step, force=True) if ckpt else None
        if ckpt is None:
            self.print0(f"stopped by {preempt.signal_name(signum)} at step {step.number}; no checkpointer, "
                        "nothing saved (pass checkpoint= to run.wrap())")
            raise SystemExit(128 + signum)
        if self.is_main:
            ckpt.mark_stopped(preempt.signal_name(signum), step.number, saved)
        self.print0(preempt.stop_line(signum, step.number, saved.name if saved else f"step-{step.number}"))
        raise SystemExit(preempt.EXIT_STOPPED)

    def start_watchdog(self) -> "watchdog.Watchdog | watchdog.NullWatchdog":
        """Heartbeats in the rendezvous store; after the first step, a rank that makes no progress for
        the step timeout (or 5x the slowest step) is named and the job ends (exit 124). run.steps() runs it."""
        if self._late.watchdog is None:
            self._late.watchdog = watchdog.watch(self._late.store, self.rank, self.world_size,
                                                 self.options.step_timeout)
            self._late.closers.append(self._late.watchdog.stop)
        return self._late.watchdog

    @contextlib.contextmanager
    def untimed(self, phase: str, kind: str = "other") -> Iterator[None]:
        """A phase no step predicts (evaluation, a checkpoint write): the watchdog does not time it, but a
        rank that stops during it (its heartbeat stands still) is still named and the job ended. Its duration
        is added to `untimed_seconds[kind]`, for the run's phase split in summary.json."""
        paused = self._late.watchdog.paused(phase) if self._late.watchdog is not None else contextlib.nullcontext()
        start = time.perf_counter()
        try:
            with paused:
                yield
        finally:
            spent = self._late.untimed_seconds
            spent[kind] = spent.get(kind, 0.0) + time.perf_counter() - start

    @property
    def untimed_seconds(self) -> dict[str, float]:
        """Seconds spent so far in untimed phases, by kind ("eval", "checkpoint", ...)."""
        return dict(self._late.untimed_seconds)

    def on_close(self, fn: Callable[[], None]) -> None:
        """Call `fn` when the run closes (last registered, first called), whatever ends it."""
        self._late.closers.append(fn)

    # ------------------------------------------------------------ teardown
    def close(self) -> None:
        """Release the all-reduce thread, the watchdog and the process group. Safe to call twice."""
        if self._late.closed:
            return
        self._late.closed = True
        try:
            for close in reversed(self._late.closers):
                close()
        finally:
            _pg.teardown()
            # Destroy the rendezvous store now, not during interpreter shutdown, when its C++
            # threads may outlive the objects they use (seen as "terminate called" aborts at exit).
            self._late.store = None
            gc.collect()

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _has_running_stats(model: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.modules.batchnorm._NormBase) and m.track_running_stats
               for m in model.modules())


def _shape_of(loader: DataLoader) -> tuple[int, int | None]:
    """(batch, tokens per example) to calibrate on: what run.loader() recorded, else the batch size alone."""
    shape = getattr(loader, "corecpu_shape", None)
    return shape if shape is not None else (loader.batch_size or DEFAULT_SHAPE[0], None)


def _autocasting(forward: Callable[..., Any]) -> Callable[..., Any]:
    """`forward` under bf16 autocast: the user never writes autocast around a forward (Fabric does the same)."""
    @functools.wraps(forward)
    def autocast_forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return forward(*args, **kwargs)
    return autocast_forward


def setup(options: RunOptions | None = None, *, graceful_stop: bool = False,
          env: MutableMapping[str, str] | None = None, **overrides: Any) -> Run:
    """Detect the launcher, bind threads and CPUs, create the process group; decide once.

    `options` (or keyword overrides of its fields): backend auto|gloo|ccl|mpi (process group); allreduce
    auto|gloo|mpi|ccl|shm (gradients) and allreduce_dtype fp32|bf16; precision auto|fp32|bf16; threads (0: this rank's cores); ipex auto|off;
    compile; dist_timeout; step_timeout (the watchdog run.steps() runs).
    graceful_stop: the first SIGTERM/SIGINT/SIGUSR1 only sets a flag, and run.steps() saves and exits at the
    next step boundary (run.steps() turns it on itself when it runs in the main thread).
    Ranks always die with their launcher. Use as `with corecpu.setup() as run:` or call `run.close()`.
    """
    env = os.environ if env is None else env
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(RunOptions)})
    if unknown:
        raise CoreCPUError(f"setup() has no option {unknown[0]!r}; options are "
                           f"{', '.join(f.name for f in dataclasses.fields(RunOptions))}")
    opts = dataclasses.replace(options or RunOptions(), **overrides).validate()
    info = detect_launcher(env)
    cpus, warning = _threads.launcher_cpus(env)
    if warning:
        print(f"corecpu: warning: {warning}", file=sys.stderr, flush=True)
    node = NodePlan(info, env, opts.binding)  # computed on first use, then shared by threads and the MPI all-reduce
    # Binding first: threads started later (the watchers below, gloo's, OpenMP's) inherit the rank's CPUs.
    decision = _threads.configure_threads(info, opts.threads, cpus, node, env=env)
    if info.rank == 0 and (warning := _threads.threads_warning(opts.threads, decision.bind_to or cpus)):
        print(f"corecpu: warning: {warning}", file=sys.stderr, flush=True)
    lifeline.install(env, launched=info.distributed)  # no orphan rank outlives its launcher
    if graceful_stop:
        preempt.install(announce=info.rank == 0)  # from the main thread, before the process group
    if info.mpi_world and opts.allreduce in ("auto", "mpi", "shm"):
        mpi_init.start_early(env)  # the MPI hook (or shm's leaders) may need it; it overlaps model loading
    measured_paths = opts.allreduce == "auto" and opts.allreduce_dtype == "fp32"
    pg = _pg.init_distributed(opts.backend, opts.dist_timeout, env, info=info, plan_env=lambda: node.env,
                              allreduce=opts.allreduce,
                              gloo_instead=(lambda: gradient_path.cached_winner_without_ccl(info)) if measured_paths else None)
    try:
        path, path_reason = choose_allreduce(opts.allreduce, info, env, backend=pg.backend, dtype=opts.allreduce_dtype)
        # auto where several paths can run: timed on these ranks (cached), the winner's object kept for wrap()
        path, path_reason, gradient_allreduce = gradient_path.settle(opts.allreduce, opts.allreduce_dtype, info,
                                                                     pg.backend, node, path, path_reason,
                                                                     backend_requested=opts.backend,
                                                                     ccl_skipped=pg.ccl_skipped)
        bindings = tuple(_pg.gather_objects(_threads.binding_report()))
        run = Run(launch=info, options=opts, backend=pg.backend, backend_reason=pg.backend_reason,
                  threads=decision.threads, threads_reason=decision.reason, cpus=tuple(_threads.process_cpus()),
                  allreduce=path, allreduce_reason=path_reason, ipex=_ipex.wanted(opts.ipex),
                  master=f"{pg.master_addr}:{pg.master_port}" if pg.master_addr else "", bindings=bindings,
                  _node=node, **_threads.binding_of(decision, env, lambda: node.binding))
        run._late.store = pg.store
        run._late.gradient_allreduce = gradient_allreduce
        if gradient_allreduce is not None:
            run._late.closers.append(gradient_allreduce.close)
        if graceful_stop:
            run._late.closers.append(preempt.uninstall)
        if opts.precision != "auto":  # explicit: known now (for bf16, wrap() may add a cached measurement's warning)
            run._late.precision = decide_precision(opts.precision, read_cpu_features())
            run._late.precision_final = opts.precision == "fp32"
    except BaseException:
        _pg.teardown()
        raise
    return run


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
