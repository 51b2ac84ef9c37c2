"""`corecpu.setup()`: reads the rank's environment once and decides everything about the machine, then hands the
frozen `Run` (corecpu.training.run) its choices.

The order is what the choices need: the launcher's facts first (who this rank is), then the binding (threads started
later, gloo's and OpenMP's among them, inherit the rank's CPUs), the lifeline and stop signals (before the process
group, from the main thread), the process group, and the gradient path (timed on these ranks where several can run).
The Run decides nothing more until wrap() settles what depends on the model.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from types import MappingProxyType
from typing import Any, Mapping, MutableMapping

from corecpu import envvars
from corecpu.cluster.launchers import detect_launcher
from corecpu.compute import ipex as _ipex
from corecpu.compute.precision import decide_precision
from corecpu.cpu import allocator as _allocator, threads as _threads
from corecpu.cpu.hardware import read_cpu_features
from corecpu.cpu.node_plan import NodePlan
from corecpu.cpu.topology import default_library_dirs, find_libraries
from corecpu.distributed import gradient_path
from corecpu.distributed import process_group as _pg
from corecpu.distributed.allreduce import choose_allreduce
from corecpu.errors import CoreCPUError
from corecpu.reliability import lifeline, preempt, watchdog
from corecpu.training.lifetime import Lifetime
from corecpu.training.loop_clock import LoopClock
from corecpu.training.run import Run
from corecpu.training.run_options import RunOptions


def setup(options: RunOptions | None = None, *, graceful_stop: bool = False,
          env: MutableMapping[str, str] | None = None, **overrides: Any) -> Run:
    """Detect the launcher, bind threads and CPUs, create the process group; decide once.

    `options` (or keyword overrides of its fields): backend auto|gloo|ccl|mpi (process group); allreduce
    auto|gloo|mpi|ccl|shm (gradients) and allreduce_dtype fp32|bf16; sparse_embedding_allreduce auto|on|off (the word
    embedding's gradient by the rows some rank touched); precision auto|fp32|bf16; attention auto|sdpa|eager (a Hugging
    Face model's attention kernel, timed at wrap()); dropout fast|torch (the kernel of every F.dropout inside the
    wrapped forward); last_layer auto|full (a BERT-style classifier's last layer at its first token only);
    grad_clip fused|torch (run.clip_grad_norm_'s scale inside the fused AdamW step, or torch's
    clip); threads (0: this rank's cores); ipex auto|off;
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
    # A rank's accelerator is its CPU. Where DeepSpeed is installed, whatever imports it (the shm op; accelerate's
    # unwrap inside save_pretrained, for a DDP model) would otherwise print that it "was unable to detect" a GPU.
    env.setdefault("DS_ACCELERATOR", "cpu")
    info = detect_launcher(env)
    if info.rank == 0:  # at once: what follows (process group, all-reduce timing) can take a while
        print(f"corecpu {info.world_size} rank(s) via {info.label}: setting up", flush=True)
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
    measured_paths = opts.allreduce == "auto" and opts.allreduce_dtype == "fp32"
    busy = bool(env.get(envvars.CPUS_BUSY))  # what launch.sh measured: timings are cached per load state
    pg = _pg.init_distributed(opts.backend, opts.dist_timeout, env, info=info, plan_env=lambda: node.env,
                              allreduce=opts.allreduce,
                              gloo_instead=(lambda: gradient_path.cached_winner_without_ccl(info, busy=busy))
                              if measured_paths else None)
    life = Lifetime(pg.store)
    try:
        path, path_reason = choose_allreduce(opts.allreduce, info, env, backend=pg.backend, dtype=opts.allreduce_dtype)
        # auto where several paths can run: timed on these ranks (cached), the winner's object kept for wrap()
        path, path_reason, measured = gradient_path.settle(opts.allreduce, opts.allreduce_dtype, info, pg.backend,
                                                           node, path, path_reason, backend_requested=opts.backend,
                                                           ccl_skipped=pg.ccl_skipped, busy=busy)
        if measured is not None:
            life.on_close(measured.close)
        if graceful_stop:
            life.on_close(preempt.uninstall_unless_stopping)
        bindings = tuple(_frozen(b) for b in _pg.gather_objects(_threads.binding_report(env)))

        def start_watchdog() -> "watchdog.Watchdog | watchdog.NullWatchdog":
            dog = watchdog.watch(life.store, info.rank, info.world_size, opts.step_timeout)
            life.on_close(dog.stop)
            return dog

        # explicit fp32/bf16 is known now (for bf16, wrap() may add a cached measurement's warning)
        requested = decide_precision(opts.precision, read_cpu_features()) if opts.precision != "auto" else None
        run = Run(launch=info, options=opts, backend=pg.backend, backend_reason=pg.backend_reason,
                  threads=decision.threads, threads_reason=decision.reason,
                  cpus=tuple(bindings[info.rank]["cpus"]),
                  allreduce=path, allreduce_reason=path_reason, ipex=_ipex.wanted(opts.ipex),
                  master=f"{pg.master_addr}:{pg.master_port}" if pg.master_addr else "", bindings=bindings,
                  ranks_reason=env.get(envvars.RANKS_DECISION, ""),
                  requested_precision=requested, _node=node, _measured_path=measured, _life=life,
                  allocator=_allocator.describe(env, lambda: find_libraries(default_library_dirs(env))),
                  _clock=LoopClock(start_watchdog), **_threads.binding_of(decision, env, lambda: node.binding))
    except BaseException:
        _pg.teardown()
        raise
    return run


def _frozen(report: dict[str, Any]) -> Mapping[str, Any]:
    """A read-only view of one rank's binding report, its lists as tuples: a Run's facts cannot change."""
    return MappingProxyType({k: tuple(v) if isinstance(v, list) else v for k, v in report.items()})


__all__ = ["setup"]
