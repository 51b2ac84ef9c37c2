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
import signal
import socket
import subprocess
import sys
from dataclasses import replace
from typing import Mapping, NoReturn, Sequence

from corecpu import envvars
from corecpu.cluster import ccl_shm, job_records
from corecpu.cluster.launchers import LaunchInfo, detect_launcher
from corecpu.cluster.listeners import close_inherited_wildcard_listeners
from corecpu.cpu.node_plan import plan_backend, plan_binding, plan_rank, rank_environment
from corecpu.cpu.placement import add_request_arguments, make_plan, request_from_args
from corecpu.cpu.topology import add_detection_arguments, topology_from_args
from corecpu.errors import CoreCPUError, run_cli
from corecpu.launching.launch import LAUNCHER_IGNORES
from corecpu.launching.rank_logs import log_path, route, stream_targets
from corecpu.reliability.lifeline import die_with_parent



def build_parser() -> argparse.ArgumentParser:
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
    options, cmd = split_command(argv)
    args = build_parser().parse_args(options)
    info = detect_launcher(environ)
    request = request_from_args(args)
    if args.backend is None:  # what the user asked the launcher for (./launch.sh 2 --backend ccl)
        request = replace(request, backend=plan_backend(environ))
    binding, binding_reason = plan_binding(environ, args.binding or "auto")
    request = replace(request, binding=binding, allocator=environ.get(envvars.ALLOCATOR, "auto"))
    if request.nproc != "auto" and request.nproc != info.local_world_size and not info.launched:
        raise CoreCPUError(
            f"--nproc {request.nproc} but no launcher started this process, so it is 1 rank; "
            "run it under mpirun, srun or torchrun, or drop --nproc"
        )
    if request.nproc != "auto" and request.nproc != info.local_world_size:
        raise CoreCPUError(
            f"--nproc {request.nproc} but {info.launcher} started {info.local_world_size} rank(s) on this node; "
            "drop --nproc or start the same number of ranks"
        )
    # A launcher may have pinned us already (Open MPI binds to a core for np <= 2,
    # Intel MPI to its domain): plan from the cgroup's CPUs, not that narrowed mask.
    # srun --cpu-bind is the exception: Slurm gave this task its CPUs on purpose, so the
    # plan covers this rank alone on them (threads, memory node, OMP places).
    keep_srun = args.allowed_cpus is None and srun_bound(info, environ)
    topology = topology_from_args(args, read_isa=False, allowed_from_cpuset=args.allowed_cpus is None and not keep_srun,
                                  env=environ)
    if keep_srun:
        plan = make_plan(topology, replace(request, nproc=1))
        rank = replace(plan.ranks[0], local_rank=info.local_rank)
    else:
        plan, rank = plan_rank(info, environ, topology, request)
    env = rank_environment(plan, rank, environ)
    env[envvars.BINDING], env[envvars.BINDING_REASON] = binding, binding_reason  # recorded by corecpu.setup()

    messages = []
    if info.local_rank == 0:
        messages += [f"corecpu.bind: warning: {w}" for w in plan.warnings]

    prefix = [] if args.no_membind else list(rank.membind)
    if prefix and not _numactl_works(prefix, env):
        if info.local_rank == 0:
            messages.append("corecpu.bind: numactl cannot set a memory policy here (no CAP_SYS_NICE?); memory not bound")
        prefix = []
    return prefix + cmd, env, rank.pin_cpus, messages


def srun_bound(info: LaunchInfo, env: Mapping[str, str]) -> bool:
    """Pure: did srun bind this task (--cpu-bind=cores, mask_cpu:..., or the site's default)?
    srun exports SLURM_CPU_BIND_TYPE to each task; `--cpu-bind=none` says "none"."""
    kind = env.get("SLURM_CPU_BIND_TYPE", "").strip().lower()
    return info.slurm_task and bool(kind) and not kind.startswith("none")


def _numactl_works(prefix: list[str], env: dict[str, str]) -> bool:
    # Docker's default seccomp profile refuses set_mempolicy; find out before the rank dies of it.
    try:
        return subprocess.run(prefix + ["true"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def route_output(env: dict[str, str]) -> None:
    """--log-dir, --redirects, --tee and --local-ranks-filter for this rank (corecpu.launching.rank_logs). A rank
    whose stdout reaches a file is told it has no terminal: no progress bar, no escape codes in the file."""
    info = detect_launcher(env)
    targets = stream_targets(info.local_rank, env.get(envvars.LOG_DIR), env.get(envvars.LOG_REDIRECTS),
                             env.get(envvars.LOG_TEE), env.get(envvars.LOG_RANKS_FILTER))
    if targets[1][0]:
        env.pop(envvars.TTY, None)
    if any(to_file or not to_console for to_file, to_console in targets.values()):
        route(targets, log_path(env.get(envvars.LOG_DIR) or os.devnull, info.rank))


# What hydra (or a person) sends the supervisor goes on to the rank.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGQUIT)


def exec_supervised(cmd: list[str], env: dict[str, str], rank: int) -> NoReturn:
    """Run the rank as a child and stay its parent, to say how it ended (CORECPU_JOB_DIR's rank-N.ended).

    Intel MPI's mpiexec.hydra waits for every rank whatever one of them did: a rank killed during start-up
    (SIGKILL, the OOM killer) or refusing to start left the others waiting for their whole timeout, and hydra
    reports nothing until the end. Only a rank's parent learns its exit status; `corecpu launch` reads the
    record, names the rank and ends the job. This process forwards every signal it gets to the rank, exits
    with the rank's code (128+N for signal N), and dies with its own parent (PDEATHSIG), the rank with it."""
    child = 0

    def forward(signum: int, _frame: object) -> None:
        if child > 0:
            try:
                os.kill(child, signum)
            except ProcessLookupError:
                pass

    for signum in FORWARDED:  # before fork: no signal may find the supervisor without its handler
        signal.signal(signum, forward)
    child = os.fork()
    if child == 0:
        try:
            for signum in FORWARDED:
                signal.signal(signum, signal.SIG_DFL)
            die_with_parent()
            os.execvpe(cmd[0], cmd, env)
        finally:
            os._exit(127)  # exec failed (checked before): nothing else of this process may run
    job_records.note(env, rank, "pid", f"{child} {socket.gethostname()}")
    _, status = os.waitpid(child, 0)  # PEP 475: retried after each forwarded signal
    code = os.waitstatus_to_exitcode(status)  # -N: killed by signal N
    if code:
        job_records.note(env, rank, "ended", f"signal {-code}" if code < 0 else f"exit {code}")
        ccl_shm.remove_regions(child)  # a rank that crashed or was killed did not remove its own
    # As a shell reports it: mpiexec.hydra would print a "BAD TERMINATION" block for a rank killed by a signal,
    # while `corecpu launch` names the rank in one line.
    os._exit(128 - code if code < 0 else code)



def main(argv: Sequence[str] | None = None) -> NoReturn:
    def run() -> int:
        cmd, env, cpus, messages = prepare(sys.argv[1:] if argv is None else argv, dict(os.environ))
        for line in messages:
            print(line, file=sys.stderr, flush=True)
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as exc:
            raise CoreCPUError(f"cannot pin to CPUs {env[envvars.BOUND_CPUS]}: {exc.strerror}; check --allowed-cpus") from None
        if shutil.which(cmd[0], path=env.get("PATH")) is None and os.sep not in cmd[0]:
            raise CoreCPUError(f"command not found: {cmd[0]}; check the command after --")
        # The rank must not outlive the launcher process that started it (hydra_pmi_proxy, the
        # torchrun agent); PDEATHSIG survives exec, so set it on the way out.
        die_with_parent()
        # hydra_pmi_proxy's 0.0.0.0 listener, inherited by every rank: nothing of the job listens beyond
        # loopback (or, on several hosts, beyond the interface the hosts share).
        close_inherited_wildcard_listeners(env)
        route_output(env)  # last, so the lines above still reach the launcher's terminal
        # `corecpu launch` starts the launcher with the stop signals ignored, and an ignored signal stays
        # ignored across fork and exec: the rank gets them back, to stop (and save) on them.
        for signum in LAUNCHER_IGNORES:
            signal.signal(signum, signal.SIG_DFL)
        info = detect_launcher(env)
        if info.mpi_world and job_records.note(env, info.rank, "pid", f"{os.getpid()} {socket.gethostname()}"):
            exec_supervised(cmd, env, info.rank)  # under `corecpu launch`'s mpirun: see exec_supervised
        job_records.note(env, info.rank, "pid", f"{os.getpid()} {socket.gethostname()}")  # the same PID after exec
        try:
            os.execvpe(cmd[0], cmd, env)
        except OSError as exc:
            raise CoreCPUError(f"cannot run {cmd[0]}: {exc.strerror}; check the command after --") from None
        return 1  # unreachable: exec replaced us

    run_cli(run)


if __name__ == "__main__":
    main()
