"""Pin this rank to its CPUs, then exec the real command.

    python -m corecpu.bind [plan options] -- CMD ARGS...

It runs once per rank, after the launcher (mpirun, srun, torchrun) has started
the process and before torch exists in it: OpenMP sizes its thread pool and
reads the affinity mask when torch loads, so pinning afterwards is too late.
Each node plans from its own topology, so nodes of different shapes each get a
plan that fits them (a -genv'd I_MPI_PIN_DOMAIN from the head node would not).

Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from typing import NoReturn, Sequence

from corecpu.errors import CoreCPUError, run_cli
from corecpu.lifeline import die_with_parent

BOUND_CPUS_VAR = "CORECPU_BOUND_CPUS"
PLAN_NOTE_VAR = "CORECPU_PLAN_NOTE"


def build_parser() -> argparse.ArgumentParser:
    from corecpu.plan import add_request_arguments
    from corecpu.topology import add_detection_arguments

    parser = argparse.ArgumentParser(
        prog="python -m corecpu.bind",
        description="Pin this rank's CPUs and memory from the node's plan, then exec CMD.",
        usage="python -m corecpu.bind [options] -- CMD [ARGS...]",
    )
    add_request_arguments(parser, nproc_help="ranks on this node (default: the launcher's local world size)")
    add_detection_arguments(parser)
    parser.add_argument("--no-membind", action="store_true", help="do not bind memory with numactl")
    return parser


def split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    argv = list(argv)
    if "--" not in argv:
        raise CoreCPUError("no command to run; put it after --, e.g. python -m corecpu.bind -- python train.py")
    i = argv.index("--")
    options, cmd = argv[:i], argv[i + 1:]
    if not cmd:
        raise CoreCPUError("no command after --; e.g. python -m corecpu.bind -- python train.py")
    return options, cmd


def prepare(argv: Sequence[str], environ: dict[str, str]) -> tuple[list[str], dict[str, str], tuple[int, ...], list[str]]:
    """Plan for this rank: (command to exec, its environment, CPUs to pin, lines for stderr).

    Kept free of side effects so it can be tested without exec'ing anything.
    """
    from dataclasses import replace

    from corecpu.launchers import detect_launcher
    from corecpu.plan import make_plan, request_from_args
    from corecpu.topology import format_cpu_list, topology_from_args

    options, cmd = split_command(argv)
    args = build_parser().parse_args(options)
    info = detect_launcher(environ)
    request = request_from_args(args)
    if request.nproc != "auto" and request.nproc != info.local_world_size and info.launcher == "single":
        raise CoreCPUError(
            f"--nproc {request.nproc} but no launcher started this process, so it is 1 rank; "
            "run it under mpirun, srun or torchrun, or drop --nproc"
        )
    if request.nproc != "auto" and request.nproc != info.local_world_size:
        raise CoreCPUError(
            f"--nproc {request.nproc} but {info.launcher} started {info.local_world_size} rank(s) on this node; "
            "drop --nproc or start the same number of ranks"
        )
    # The launcher decides how many ranks exist; the plan can only make them fit.
    request = replace(request, nproc=info.local_world_size, allow_oversubscribe=True)
    # A launcher may have pinned us already (Open MPI binds to a core for np <= 2,
    # Intel MPI to its domain): plan from the cgroup's CPUs, not that narrowed mask.
    topology = topology_from_args(args, read_isa=False, allowed_from_cpuset=args.allowed_cpus is None, env=environ)
    plan = make_plan(topology, request)
    rank = plan.ranks[info.local_rank]

    env = dict(environ)
    for key, value in plan.env.items():
        if key == "LD_PRELOAD":
            # Keep whatever the user preloads; ours first so the allocator wins.
            existing = [p for p in environ.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p]
            value = ":".join(dict.fromkeys(value.split(":") + existing))
        env[key] = value
    env["OMP_NUM_THREADS"] = str(rank.omp_num_threads)
    env[BOUND_CPUS_VAR] = format_cpu_list(rank.cpus)
    if plan.warnings or plan.notes:
        env[PLAN_NOTE_VAR] = "; ".join(plan.warnings + plan.notes)

    messages = []
    if info.local_rank == 0:
        messages += [f"corecpu.bind: warning: {w}" for w in plan.warnings]

    prefix = [] if args.no_membind else list(rank.membind)
    if prefix and not _numactl_works(prefix, env):
        if info.local_rank == 0:
            messages.append("corecpu.bind: numactl cannot set a memory policy here (no CAP_SYS_NICE?); memory not bound")
        prefix = []
    return prefix + cmd, env, rank.cpus, messages


def _numactl_works(prefix: list[str], env: dict[str, str]) -> bool:
    # Docker's default seccomp profile refuses set_mempolicy; find out before the rank dies of it.
    try:
        return subprocess.run(prefix + ["true"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def main(argv: Sequence[str] | None = None) -> NoReturn:
    def run() -> int:
        cmd, env, cpus, messages = prepare(sys.argv[1:] if argv is None else argv, dict(os.environ))
        for line in messages:
            print(line, file=sys.stderr, flush=True)
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as exc:
            raise CoreCPUError(f"cannot pin to CPUs {env[BOUND_CPUS_VAR]}: {exc.strerror}; check --allowed-cpus") from None
        if shutil.which(cmd[0], path=env.get("PATH")) is None and os.sep not in cmd[0]:
            raise CoreCPUError(f"command not found: {cmd[0]}; check the command after --")
        # The rank must not outlive the launcher process that started it (hydra_pmi_proxy, the
        # torchrun agent); PDEATHSIG survives exec, so set it on the way out.
        die_with_parent()
        try:
            os.execvpe(cmd[0], cmd, env)
        except OSError as exc:
            raise CoreCPUError(f"cannot run {cmd[0]}: {exc.strerror}; check the command after --") from None
        return 1  # unreachable: exec replaced us

    run_cli(run)


if __name__ == "__main__":
    main()
