"""The `corecpu` command. One `_add_<name>` + `cmd_<name>` pair per subcommand (`export` and `cache` keep
theirs in corecpu/export.py and corecpu/cache_admin.py).

Nothing imports this module: it sits on top of the package. Everything it imports is torch-free,
so every subcommand starts fast; rich is imported only to draw a plan.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Callable, NoReturn, Sequence

from corecpu import atomic, cache_admin, envvars, export
from corecpu.cpu.cgroups import REAL_CGROUP
from corecpu.cpu.cpulist import format_cpu_list
from corecpu.cpu.hardware import TRACKED_FLAGS
from corecpu.cpu.node_plan import resolve_binding
from corecpu.cpu.placement import add_request_arguments, make_plan, request_from_args
from corecpu.cpu.topology import REAL_SYSFS, add_detection_arguments, topology_from_args
from corecpu.data.builtin import write_task
from corecpu.errors import CoreCPUError, run_cli
from corecpu.launching.build_ccl import build_ccl
from corecpu.launching.environment import collect, render_text
from corecpu.launching.launch import main as launch_main
from corecpu.reporting.run_report import load_run, render, summarize

Command = Callable[[argparse.Namespace], int]


# ---------------------------------------------------------------- plan


def _add_plan(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="show how ranks would be pinned on this node",
        description="Detect this node's CPUs and print the per-rank pinning plan and its environment.",
    )
    add_request_arguments(p)
    add_detection_arguments(p)
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the plan as JSON")
    out.add_argument("--export", action="store_true", help="print shell `export` lines (per-rank settings as comments)")
    p.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    topology = topology_from_args(args)
    # Sample the CPUs' load only for this machine's own topology, not for a --sysfs tree from elsewhere.
    binding, why = resolve_binding(args.binding or "auto", os.environ, topology, measure=args.sysfs == REAL_SYSFS)
    request = dataclasses.replace(request_from_args(args), binding=binding,
                                  allocator=os.environ.get(envvars.ALLOCATOR, "auto"))
    plan = dataclasses.replace(make_plan(topology, request), binding_reason=why)
    if args.json:
        print(json.dumps(plan.to_json(), indent=2))
    elif args.export:
        sys.stdout.write(plan.to_shell())
    else:
        render_plan(plan)
    return 0


def render_plan(plan, console=None) -> None:  # noqa: ANN001 - rich types imported lazily
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    topo = plan.topology
    machine = Table(title="Machine", show_header=False)
    machine.add_column("what", style="bold")
    machine.add_column("value")
    machine.add_row("model", topo.model_name)
    machine.add_row("sockets", str(len(topo.packages)))
    machine.add_row("NUMA nodes", "  ".join(f"{n}: {format_cpu_list(c) or '(no CPUs)'}" for n, c in topo.nodes))
    machine.add_row("cores", str(len(topo.cores)))
    machine.add_row("threads", str(len(topo.online)))
    restricted = "" if topo.allowed == topo.online else f" (of {format_cpu_list(topo.online)})"
    machine.add_row("allowed CPUs", f"{format_cpu_list(topo.allowed)}{restricted}")
    quota = "none" if topo.cpu_quota is None else f"{topo.cpu_quota:g} CPUs -> {topo.quota_threads} busy thread(s)"
    machine.add_row("CPU quota", quota)
    if topo.l3_domains:
        machine.add_row("L3 domains", "  ".join(format_cpu_list(d) for d in topo.l3_domains))
    if topo.isa_known:
        machine.add_row("ISA", " ".join(f"{f}{'+' if f in topo.isa_flags else '-'}" for f in TRACKED_FLAGS))
    else:
        machine.add_row("ISA", "not read")
    libs = topo.libraries
    machine.add_row("allocator", libs.tcmalloc or (f"{libs.jemalloc} (preloaded only with {envvars.ALLOCATOR}=jemalloc)"
                                                   if libs.jemalloc else "none found (glibc malloc)"))
    machine.add_row("OpenMP", libs.iomp5 or "GNU libgomp (libiomp5 not found)")
    machine.add_row("numactl", topo.numactl or "not found")
    console.print(machine)

    ranks = Table(title="Ranks")
    for col in ("rank", "NUMA", "cores", "compute CPUs", "OMP threads", "CCL worker CPUs", "memory"):
        ranks.add_column(col)
    for r in plan.ranks:
        node = ",".join(map(str, r.numa_nodes))
        workers = format_cpu_list(r.ccl_worker_cpus) if r.ccl_worker_cpus else "-"
        cores = "shared" if plan.oversubscribed else str(r.cores)
        ranks.add_row(str(r.local_rank), node, cores, r.cpulist, str(r.omp_num_threads), workers,
                      " ".join(r.membind) or "-")
    console.print(ranks)

    env = Table(title="Environment (all ranks)")
    env.add_column("variable", style="bold")
    env.add_column("value", overflow="fold")
    for k, v in plan.env.items():
        env.add_row(k, v)
    console.print(env)
    for w in plan.warnings:
        console.print(f"[bold yellow]warning:[/] {w}", highlight=False)
    console.print(f"binding: {plan.request.binding}" + (f" ({plan.binding_reason})" if plan.binding_reason else ""),
                  highlight=False)
    for n in plan.notes:
        console.print(f"note: {n}", highlight=False)


# ---------------------------------------------------------------- env


def _add_env(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "env",
        help="print versions, CPU, launcher, cgroup limits and the plan, for a bug report",
        description="Print what a bug report needs: Python and package versions (torch, transformers, impi-rt, "
        "mpi4py, oneCCL bindings, IPEX, DeepSpeed), the CPU model and flags, the launcher that started this "
        "process and the launch commands found, cgroup limits, and this node's default plan.",
    )
    add_request_arguments(p)
    add_detection_arguments(p)
    p.add_argument("--json", action="store_true", help="print it as JSON (with every CPU flag)")
    p.set_defaults(func=cmd_env)


def cmd_env(args: argparse.Namespace) -> int:
    try:
        plan, error = make_plan(topology_from_args(args), request_from_args(args)), None
    except CoreCPUError as exc:  # a machine corecpu cannot plan is worth reporting, not a reason to stop
        plan, error = None, str(exc)
    report = collect(plan, error, cgroup_root=args.cgroup or REAL_CGROUP, cpuinfo=args.cpuinfo)
    sys.stdout.write(json.dumps(report, indent=2) + "\n" if args.json else render_text(report))
    return 0


# ---------------------------------------------------------------- make-data


def _add_make_data(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "make-data",
        help="write a built-in task as a TSV file",
        description="Write a built-in task (what --data builtin or --data paraphrase trains on) as TSV with a "
        "`sentence<TAB>label` (or `sentence1<TAB>sentence2<TAB>label`) header, to see the expected format or "
        "to edit it.",
    )
    p.add_argument("path", help="file to write (refuses to overwrite)")
    p.add_argument("--task", choices=("builtin", "paraphrase"), default="builtin",
                   help="builtin: review sentiment; paraphrase: sentence pairs of real-data length (default: builtin)")
    p.add_argument("--split", choices=("train", "eval"), default="train", help="which split (default: train)")
    p.add_argument("--n", type=int, default=None,
                   help="number of examples (default: builtin 2000 train / 400 eval, paraphrase 3000 / 600)")
    p.add_argument("--seed", type=int, default=0, help="generator seed, as train.py --seed (default: 0)")
    p.set_defaults(func=cmd_make_data)


def cmd_make_data(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if path.exists():
        raise CoreCPUError(f"{path} already exists; remove it or choose another path")
    if args.n is not None and args.n < 1:
        raise CoreCPUError(f"--n must be at least 1, got {args.n}")
    with atomic.replacing(path) as tmp:
        rows = write_task(tmp, args.task, split=args.split, n=args.n, seed=args.seed)
    print(f"wrote {rows} {args.task} {args.split} examples to {path}")
    return 0


# ---------------------------------------------------------------- launch


def _add_launch(sub: argparse._SubParsersAction) -> None:
    # Listed for --help only: main() hands `corecpu launch ...` to corecpu.launch untouched, because
    # the script's own arguments (-n, -f, ...) must not be parsed here.
    sub.add_parser("launch", help="start N ranks of a script, each bound to its own cores (corecpu launch -h)",
                   add_help=False)


# ---------------------------------------------------------------- train


def _add_train(sub: argparse._SubParsersAction) -> None:
    # Listed for --help only: main() execs train.py (shipped as corecpu/train.py) with the arguments untouched.
    sub.add_parser("train", help="run train.py, the built-in training loop, in this process (corecpu train --help)",
                   add_help=False)


def exec_train(argv: Sequence[str]) -> NoReturn:
    """`corecpu train ARGS` is `python -u train.py ARGS`: the same file, as a fresh process (exec, so a
    launcher's signals and exit code reach it unchanged)."""
    os.execv(sys.executable, [sys.executable, "-u", "-m", "corecpu.train", *argv])


# ---------------------------------------------------------------- report


def _add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="draw a run's curves and CPU binding to a PNG and print a summary",
        description="Render a training run (its --output-dir): loss and learning-rate curves, throughput, eval "
        "scores and the per-rank CPU binding, to a PNG, and print a short text summary.",
    )
    p.add_argument("output_dir", metavar="OUTPUT_DIR", help="the run's --output-dir")
    p.add_argument("--compare", metavar="DIR2", action="append", default=[],
                   help="another run to overlay (repeat for more: orange, green, ...)")
    p.add_argument("--x", choices=("steps", "samples", "time"), default="steps",
                   help="x-axis: optimizer steps, samples seen (comparable across world and batch sizes), or wall "
                        "time in the loop")
    p.add_argument("--out", metavar="PNG", help="image to write (default: OUTPUT_DIR/report.png)")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    runs = [load_run(args.output_dir)] + [load_run(other) for other in args.compare]
    print("\n\n".join(summarize(run) for run in runs))
    out = render(runs, Path(args.out) if args.out else Path(args.output_dir) / "report.png", x=args.x)
    print(f"wrote {out}")
    return 0


# ---------------------------------------------------------------- build-ccl


def _add_build_ccl(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "build-ccl",
        help="build and install the oneCCL bindings (--backend ccl) for this environment's torch",
        description="Build oneccl_bindings_for_pytorch from its last upstream source (verified against a pinned "
        "SHA-256, with corecpu's patch) against the torch installed here and PyPI's oneCCL, cache the wheel under "
        "the corecpu cache, and install it with oneCCL's runtime. A cached wheel installs in seconds.",
    )
    p.add_argument("--source", metavar="SRC",
                   help=f"a source directory, tarball or git URL@COMMIT (default: ${envvars.CCL_SOURCE}, else upstream)")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="parallel compile jobs (default: $MAX_JOBS, else 1: each takes about 1.5 GB of memory)")
    p.add_argument("--rebuild", action="store_true", help="build even if a cached wheel matches")
    p.add_argument("--wheel-only", action="store_true",
                   help="build (or find) the cached wheel and stop; a later build-ccl installs it in seconds "
                   "(CI builds it beside the tests this way, without changing the environment they run in)")
    p.set_defaults(func=cmd_build_ccl)


def cmd_build_ccl(args: argparse.Namespace) -> int:
    if args.jobs is not None and args.jobs < 1:
        raise CoreCPUError(f"--jobs must be at least 1, got {args.jobs}")
    build_ccl(args.source, args.jobs, args.rebuild, install_wheel=not args.wheel_only)
    return 0


# ---------------------------------------------------------------- wiring

SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    _add_plan, _add_env, _add_make_data, _add_report, _add_build_ccl, _add_launch, _add_train,
    export.add_parser, cache_admin.add_parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="corecpu", description="Data-parallel training on Xeon CPU clusters.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> NoReturn:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["launch"]:
        launch_main(args_in[1:])
    if args_in[:1] == ["train"]:
        exec_train(args_in[1:])

    def run() -> int:
        args = build_parser().parse_args(argv)
        return args.func(args)

    run_cli(run)


if __name__ == "__main__":
    main()
