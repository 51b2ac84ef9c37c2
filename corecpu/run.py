"""The front door: `run = corecpu.setup()` decides everything about the machine once.

It detects the launcher once, gives this rank its threads and CPUs (the plan
`corecpu.bind` makes), creates the process group, and resolves the backend,
the gradient all-reduce path, IPEX and precision. The returned `Run` carries
those decisions with the reason for each, and the few operations a training
loop needs: wrap a model, build a loader, autocast, accumulate without syncing,
reduce numbers, print once. Any `torch.nn.Module` and map-style `Dataset` work.

Precision "auto" is settled in `wrap()`, because the evidence it weighs (how fast
bf16 runs against fp32) is measured on the model's own shapes.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator, Mapping, MutableMapping, Sequence

from corecpu import threads as _threads  # before torch: see threads.py
from corecpu.errors import CoreCPUError
from corecpu.launchers import LaunchInfo, detect_launcher

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from corecpu import dist as _dist  # noqa: E402
from corecpu import ipex as _ipex  # noqa: E402
from corecpu import lifeline, preempt, watchdog  # noqa: E402
from corecpu.allreduce import MpiGradientAllreduce, choose_allreduce  # noqa: E402
from corecpu.hardware import Extension, read_cpu_features  # noqa: E402
from corecpu.precision import (CalibrationShapes, PrecisionChoice, agree_precision, decide_precision,  # noqa: E402
                               resolve_precision, typical_batch_length)

PRECISIONS = ("auto", "fp32", "bf16")
# torch 2.13 renamed DDP's broadcast_buffers (deprecated) to forward_sync_buffers; IPEX 2.8 needs torch 2.8.
_DDP_HAS_FORWARD_SYNC = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters


@dataclass
class _Late:
    """What is settled after setup(): precision 'auto' (needs the model) and resources to release."""

    precision: PrecisionChoice | None = None
    shape_hint: tuple[int, int | None] | None = None  # (batch, tokens per example) of the last loader: calibration
    store: Any = None  # the rendezvous store: the watchdog's heartbeats go there
    closers: list[Callable[[], None]] = field(default_factory=list)
    closed: bool = False


@dataclass(frozen=True)
class Run:
    """One rank's view of the job and every choice made for it. Create with `corecpu.setup()`."""

    launch: LaunchInfo
    backend: str  # "none" for one process
    backend_reason: str
    threads: int
    threads_reason: str
    cpus: tuple[int, ...]
    allreduce: str  # "none", "gloo" or "mpi"
    allreduce_reason: str
    ipex: Extension | None  # None: not asked for (ipex="off")
    compile: bool
    requested_precision: str
    master: str  # "host:port" of the rendezvous, "" for one process
    _late: _Late = field(default_factory=_Late, repr=False, compare=False)

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

    def describe(self) -> dict[str, str]:
        """Every resolved choice and why, for the start-up lines, config.json and checkpoints."""
        p = self._late.precision
        from corecpu.topology import format_cpu_list

        return {
            "launcher": f"{self.launch.launcher}: rank {self.rank} of {self.world_size}, "
                        f"local rank {self.local_rank} of {self.launch.local_world_size}",
            "backend": f"{self.backend} ({self.backend_reason})",
            "allreduce": f"{self.allreduce} ({self.allreduce_reason})",
            "precision": f"{p.name} ({p.reason})" if p else f"{self.requested_precision} (settled when the model is wrapped)",
            "threads": f"{self.threads} ({self.threads_reason})",
            "cpus": format_cpu_list(self.cpus),
            "ipex": ("off" if self.ipex is None else
                     f"{'ipex.optimize' if self.ipex.usable else 'not used'} ({self.ipex.reason})"),
            "compile": "torch.compile" if self.compile else "off",
        }

    def banner(self) -> list[str]:
        """Two start-up lines a person reads: who runs where, and how it computes (after wrap())."""
        p = self._late.precision
        ipex = ("off" if self.ipex is None else f"ipex.optimize applied ({p.name if p else '?'}); {self.ipex.reason}"
                if self.ipex.usable else self.ipex.reason)
        return [f"corecpu {self.world_size} rank(s) via {self.launch.launcher}; backend {self.backend} "
                f"({self.backend_reason}); gradient all-reduce {self.allreduce} ({self.allreduce_reason})",
                f"precision {self.describe()['precision']}; {self.threads} thread(s) per rank ({self.threads_reason}); "
                f"ipex: {ipex}; compile {'on' if self.compile else 'off'}"]

    def resolved(self) -> dict[str, Any]:
        """The machine-dependent choices as plain values: a resume compares them with the checkpoint's."""
        p = self._late.precision
        return {"backend": self.backend, "allreduce": self.allreduce, "threads": self.threads,
                "precision": p.name if p else None, "bf16_speedup": p.bf16_speedup if p else None,
                "source": p.source if p else None, "ipex": self.uses_ipex, "world_size": self.world_size}

    # ------------------------------------------------------------ model
    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
             scheduler: Any = None) -> tuple[torch.nn.Module, torch.optim.Optimizer | None]:
        """Settle precision, then ipex.optimize (where usable), torch.compile (if asked), DDP with the
        chosen gradient all-reduce (more than one rank). Load checkpoints *before* wrapping: IPEX
        replaces the optimizer, and a scheduler passed here is pointed at the new one."""
        precision = self.decide_precision(model)
        if self.uses_ipex:
            if optimizer is None:
                raise CoreCPUError("ipex.optimize for training needs the optimizer; pass it to wrap(), or ipex='off'")
            model, optimizer = _ipex.optimize(model, optimizer, scheduler, precision)
        if self.compile:
            # Dynamic: padded lengths change from batch to batch; bucketed lengths keep shapes few anyway.
            model = torch.compile(model, dynamic=True)
        if self.world_size > 1:
            # Broadcasting buffers costs a collective before every forward; only running statistics
            # (batch norm) change during training, and only they need rank 0's copy each step.
            # Gradients written straight into the all-reduce buckets save a copy of every gradient.
            sync = {"forward_sync_buffers" if _DDP_HAS_FORWARD_SYNC else "broadcast_buffers": _has_running_stats(model)}
            model = DistributedDataParallel(model, gradient_as_bucket_view=True, **sync)  # broadcasts rank 0's weights
            if self.allreduce == "mpi":
                hook = MpiGradientAllreduce(self.launch)  # gradient buckets over MPI; gloo keeps the rest
                hook.register(model)
                self._late.closers.append(hook.close)
        return model, optimizer

    def decide_precision(self, model: torch.nn.Module) -> PrecisionChoice:
        """Settle the precision for `model` now (wrap() does it otherwise), e.g. to record it in a checkpoint's
        configuration before resuming. A collective for more than one rank. auto: AMX means bf16; elsewhere the model's own shapes are timed in both precisions (once per CPU
        model, then cached). Every rank measures on its own cores; bf16 only if every rank found it faster."""
        if self._late.precision is None:
            batch, seq = self._late.shape_hint or (16, None)
            if seq is None:  # no lengths known: a typical fine-tuning length for sequence models, 1 row otherwise
                seq = 64 if hasattr(unwrap(model), "config") else 1
            features = read_cpu_features()
            try:
                shapes = CalibrationShapes.from_model(unwrap(model), batch, seq)
                choice = resolve_precision(self.requested_precision, features, shapes, self.threads)
            except CoreCPUError as exc:
                if self.requested_precision == "bf16":
                    choice = decide_precision("bf16", features)
                else:  # nothing bf16 could speed up (no Linear layers): fp32, and say why
                    choice = PrecisionChoice("fp32", f"no shapes to calibrate bf16 on ({exc})".split(";")[0] + ")",
                                             source="measured")
            self._late.precision = agree_precision(self.gather(choice)) if self.world_size > 1 else choice
        return self._late.precision

    def autocast(self) -> ContextManager:
        """bf16 autocast where the settled precision is bf16, else nothing. Call after wrap()."""
        p = self._late.precision
        if p is None:
            raise CoreCPUError("autocast() before wrap(): precision is settled when the model is wrapped")
        return torch.autocast("cpu", dtype=torch.bfloat16) if p.name == "bf16" else contextlib.nullcontext()

    @staticmethod
    def no_sync(model: torch.nn.Module, sync: bool) -> ContextManager:
        """For gradient accumulation: skip the all-reduce on every micro-step but the last (sync=True)."""
        if sync or not isinstance(model, DistributedDataParallel):
            return contextlib.nullcontext()
        return model.no_sync()

    # ------------------------------------------------------------ data
    def loader(self, dataset: Dataset, batch_size: int, *, shuffle: bool = True, seed: int = 0,
               collate_fn: Callable | None = None, drop_last: bool = False,
               lengths: Sequence[int] | None = None) -> DataLoader:
        """A DDP loader for a map-style dataset: every rank gets its shard and the same number of batches
        (the sampler pads with duplicates, as DistributedSampler does). Pass `lengths` to batch examples
        of similar length together (the ranks of one step get similar lengths too). Call
        `loader.sampler.set_epoch(epoch)` before each epoch; `set_epoch(epoch, skip_batches=k)` resumes mid-epoch."""
        from corecpu.sampling import train_sampler

        if batch_size < 1:
            raise CoreCPUError(f"batch_size must be at least 1, got {batch_size}")
        sampler = train_sampler(dataset, batch_size, self.rank, self.world_size, seed, shuffle, lengths)
        self._late.shape_hint = (batch_size, typical_batch_length(lengths, batch_size) if lengths else None)
        return DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate_fn, drop_last=drop_last)

    # ------------------------------------------------------------ collectives
    def all_reduce_sum(self, values: Sequence[float]) -> list[float]:
        """Sum a few numbers over all ranks (float64; a copy for one process)."""
        return _dist.all_reduce_sum(list(values))

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's picklable `obj`, in rank order, on every rank."""
        return _dist.gather_objects(obj)

    def barrier(self) -> None:
        _dist.barrier()

    def print0(self, *args: Any, **kwargs: Any) -> None:
        """print() on rank 0 only, flushed (ranks' output goes through the launcher's pipes)."""
        if self.is_main:
            print(*args, **{"flush": True, **kwargs})

    # ------------------------------------------------------------ stopping well
    def should_stop(self) -> int:
        """Collective, at an optimizer-step boundary: the stop signal (SIGTERM/SIGINT/SIGUSR1) any rank got,
        or 0; the same answer on every rank, so all save and exit together. Needs setup(graceful_stop=True)."""
        return preempt.stop_requested_everywhere()

    def watchdog(self, step_timeout: float) -> "watchdog.Watchdog | watchdog.NullWatchdog":
        """Heartbeats in the rendezvous store; after the first step, a rank that makes no progress for
        `step_timeout` seconds (or 5x the slowest step) is named and the job ends (exit 124). Call
        `.progress(step)` after each step; wrap evaluation and checkpoint writes in `.paused()`."""
        wd = watchdog.watch(self._late.store, self.rank, self.world_size, step_timeout)
        self._late.closers.append(wd.stop)
        return wd

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

    # ------------------------------------------------------------ teardown
    def close(self) -> None:
        """Release the all-reduce thread and the process group. Safe to call twice."""
        if self._late.closed:
            return
        self._late.closed = True
        try:
            for close in reversed(self._late.closers):
                close()
        finally:
            _dist.teardown()
            # Destroy the rendezvous store now, not during interpreter shutdown, when its C++
            # threads may outlive the objects they use (seen as "terminate called" aborts at exit).
            self._late.store = None
            import gc

            gc.collect()

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _has_running_stats(model: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.modules.batchnorm._NormBase) and m.track_running_stats
               for m in model.modules())


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The user's module inside DDP and torch.compile wrappers (what checkpoints and save_pretrained want)."""
    while True:
        if isinstance(model, DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def setup(backend: str = "auto", precision: str = "auto", threads: int = 0, dist_timeout: float = 120.0,
          allreduce: str = "auto", ipex: str = "auto", compile: bool = False, graceful_stop: bool = False,
          env: MutableMapping[str, str] | None = None) -> Run:
    """Detect the launcher, bind threads and CPUs, create the process group; decide once.

    backend: auto|gloo|ccl|mpi (process group); allreduce: auto|gloo|mpi (gradients);
    precision: auto|fp32|bf16; threads: 0 = this rank's cores; ipex: auto|off.
    graceful_stop: the first SIGTERM/SIGINT/SIGUSR1 only sets a flag, which the loop polls with
    `run.should_stop()` at step boundaries to save and exit; leave it off if your loop does not.
    Ranks always die with their launcher. Use as `with corecpu.setup() as run:` or call `run.close()`.
    """
    env = os.environ if env is None else env
    if precision not in PRECISIONS:
        raise CoreCPUError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if ipex not in ("auto", "off"):
        raise CoreCPUError(f"ipex must be 'auto' or 'off', got {ipex!r}")
    if threads < 0:
        raise CoreCPUError(f"threads must be 0 (this rank's cores) or positive, got {threads}")
    if not dist_timeout > 0 or not math.isfinite(dist_timeout):
        raise CoreCPUError(f"dist_timeout must be a positive number of seconds, got {dist_timeout}")
    info = detect_launcher(env)
    cpus, warning = _threads.launcher_cpus(env)
    if warning:
        print(f"corecpu: warning: {warning}", file=sys.stderr, flush=True)
    # Binding first: threads started later (the watchers below, gloo's, OpenMP's) inherit the rank's CPUs.
    decision = _threads.configure_threads(info, threads, cpus)
    if info.rank == 0 and (warning := _threads.threads_warning(threads, decision.bind_to or cpus)):
        print(f"corecpu: warning: {warning}", file=sys.stderr, flush=True)
    lifeline.install(env, launched=info.distributed)  # no orphan rank outlives its launcher
    if graceful_stop:
        preempt.install(announce=info.rank == 0)  # from the main thread, before the process group
    ctx = _dist.init_distributed(backend, dist_timeout, env, info=info)
    try:
        path, path_reason = choose_allreduce(allreduce, info, env)
        ext = _ipex.wanted(ipex)
        run = Run(launch=info, backend=ctx.backend, backend_reason=ctx.backend_reason, threads=decision.threads,
                  threads_reason=decision.reason, cpus=tuple(_threads.process_cpus()), allreduce=path,
                  allreduce_reason=path_reason, ipex=ext, compile=compile, requested_precision=precision,
                  master=f"{ctx.master_addr}:{ctx.master_port}" if ctx.master_addr else "")
        run._late.store = ctx.store
        if graceful_stop:
            run._late.closers.append(preempt.uninstall)
        if precision == "fp32":  # bf16 is settled in wrap(): a cached measurement may warn about it
            run._late.precision = decide_precision("fp32", read_cpu_features())
    except BaseException:
        _dist.teardown()
        raise
    return run
