"""Start N ranks of a training script, each bound to its own cores: `corecpu launch` and launch.sh.

    corecpu launch -n 2 my_loop.py --my-args        # 2 ranks of your script on this host
    corecpu launch --nproc-per-node 2 my_loop.py    # the same, in torchrun's words
    corecpu launch -n 8 -f hosts --ppn 4 train.py   # 2 machines x 4 ranks through Intel MPI
    corecpu launch -n 2 --dry-run my_loop.py        # print the command, environment and plan
    corecpu launch -n 2 --log-dir logs train --model tiny   # corecpu's own train.py; rank N -> logs/rank-N.log

launch.sh sets up the environment and then runs this with train.py as the default
script. Ranks start through the mpirun found, Intel MPI's, MPICH's or Open MPI's (corecpu.launching.mpirun
speaks each one's options), or torchrun where there is none,
each through `python -m corecpu.bind`, which pins it from its own node's plan
before torch loads. Options come before the script; everything after the script
is the script's (the command line: corecpu.launching.launch_args).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, NoReturn, Sequence

from corecpu import address_space, envvars
from corecpu.cluster import ccl_shm, job_records
from corecpu.cpu.cpulist import format_cpu_list
from corecpu.cpu.placement import PlanRequest, make_plan
from corecpu.cpu.sharing import decide_binding, gather_evidence
from corecpu.cpu.threads import check_omp_num_threads
from corecpu.cpu.topology import detect_topology, read_topology
from corecpu.errors import CoreCPUError, install_extra, run_cli
from corecpu.launching import job_watch, mpirun
from corecpu.launching.launch_args import LaunchRequest, build_parser, parse_args  # noqa: F401 (callers' names)
from corecpu.launching.rank_logs import failure_summary
from corecpu.launching.torchrun import loopback_ip
from corecpu.reliability.lifeline import END_JOB_SIGNAL

DEFAULT_MULTIHOST_PORT = 29500
TRAIN_OUTPUT_DIR = "runs/default"  # train.py's --output-dir default (corecpu.training.config)
TORCHRUN_MODULE = "corecpu.launching.torchrun"  # torchrun with its stores on loopback
# After a rank asks to end a hung job (END_JOB_SIGNAL), the job gets this long to end by itself (the watchdog's
# other ranks wait 5 s so that the reporter is heard) before the launcher kills what is left of it.
END_JOB_GRACE_S = 10.0
RANK_EXIT_WAIT_S = 5.0  # the job's end waits this long for its ranks here to be gone (their oneCCL regions)
EXIT_HUNG = 124  # as the watchdog's ranks exit (corecpu.reliability.watchdog.EXIT_HUNG; that module needs torch)


def read_hostfile(path: str) -> list[str]:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        raise CoreCPUError(f"hostfile {path!r} not found; pass -f with a file listing one host per line") from None
    hosts = [line.split("#")[0].replace(":", " ").split()[0] for line in lines if line.split("#")[0].strip()]
    if not hosts:
        raise CoreCPUError(f"hostfile {path!r} lists no hosts; put one host name or address per line")
    return hosts


def unresolved_host(path: str, hosts: Sequence[str], resolve=socket.getaddrinfo) -> str | None:
    """The one-line problem with the first host name that does not resolve, or None. mpirun would
    otherwise answer with a page of Intel MPI advice, after a timeout."""
    for host in dict.fromkeys(hosts):
        try:
            resolve(host, None)
        except (socket.gaierror, UnicodeError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            return (f"hostfile {path!r}: host {host!r} does not resolve ({reason}); fix the name, or add it to "
                    "/etc/hosts or DNS")
    return None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class LaunchPlan:
    command: list[str]
    env: dict[str, str]  # the variables this launch sets (on top of the caller's environment)
    local_ranks: int
    warnings: list[str]
    notes: list[str] = field(default_factory=list)  # what the launch does that a user should know (one line each)
    mpi_family: str | None = None  # mpirun.HYDRA or mpirun.OPEN_MPI when mpirun starts the ranks


def plan_launch(req: LaunchRequest, environ: Mapping[str, str], python: str, usable_cores: int,
                which=shutil.which, port=free_port, allowed_cpus: str | None = None,
                mpi_kind: Callable[[str], mpirun.MpiKind] = mpirun.detect,
                both_abis: Callable[[], bool] = mpirun.mpi4py_has_both_abis, euid: Callable[[], int] = os.geteuid
                ) -> LaunchPlan:
    """Pure apart from `which`, `port`, `mpi_kind` (which MPI an mpirun path is) and `both_abis` (whether
    mpi4py can load either MPI): the command and environment that start the job. `usable_cores`:
    this host's cores the plan may use (corecpu plan refuses more ranks than that without --oversubscribe,
    and so does this, for the ranks it starts here). `allowed_cpus`: the CPUs the user narrowed this one-host
    launch to (`user_cpu_restriction`), handed to every rank's corecpu.bind."""
    env: dict[str, str] = {}
    warnings: list[str] = []
    notes: list[str] = []
    family = None
    check_omp_num_threads(environ)  # corecpu.bind replaces it per rank: say so now, not never
    several = bool(req.hostfile) or (req.nnodes or 1) > 1
    if req.hostfile:
        hosts = read_hostfile(req.hostfile)
        nnodes = req.nnodes or len(hosts)
        if nnodes > len(hosts):
            raise CoreCPUError(f"--nnodes {nnodes} but hostfile {req.hostfile!r} lists {len(hosts)} host(s); "
                               "add hosts or lower --nnodes")
        ppn = req.ppn or -(-(req.nranks or 0) // nnodes)
        nranks = req.nranks or ppn * nnodes
        if ppn * nnodes < nranks:
            raise CoreCPUError(f"{nranks} ranks do not fit on {nnodes} hosts x --ppn {ppn}; raise --ppn or add hosts")
        default_addr = hosts[0]
        local = ppn
    else:
        hosts = []
        nnodes = req.nnodes or 1
        local = req.ppn or (req.nranks or 0) // nnodes
        nranks = local * nnodes
        default_addr = "127.0.0.1"
    env["MASTER_ADDR"] = req.master_addr or environ.get("MASTER_ADDR") or default_addr
    # One host: any free port (as torchrun --standalone); several: the conventional one (we cannot probe them).
    env["MASTER_PORT"] = str(req.master_port or environ.get("MASTER_PORT") or
                             (DEFAULT_MULTIHOST_PORT if several else port()))
    bind_opts: list[str] = ["--allowed-cpus", allowed_cpus] if allowed_cpus and not several else []
    if req.oversubscribe:
        bind_opts.append("--oversubscribe")
        if local > usable_cores:
            warnings.append(f"{local} ranks on a host with {usable_cores} usable cores: ranks will share cores, "
                            "1 thread each (slow; fine for testing)")
    elif local > usable_cores and not req.hostfile:  # the hosts of a hostfile: each one's corecpu.bind says
        raise CoreCPUError(f"{local} ranks need {local} cores but this host has {usable_cores} usable; start "
                           f"{usable_cores} or fewer, or add --oversubscribe to let ranks share cores "
                           "(1 thread each; slow, for testing)")

    launcher = req.launcher or ("mpirun" if which("mpirun") else "torchrun" if which("torchrun") else None)
    if launcher is None:
        raise CoreCPUError(f"neither mpirun nor torchrun found; {install_extra('mpi')}, or activate the env that has torch")
    if req.hostfile is None and nnodes > 1 and req.launcher is None:
        launcher = "torchrun"  # one launcher per node, as torchrun runs (launch_args.check refused mpirun)
    if launcher == "torchrun" and req.hostfile:
        raise CoreCPUError(f"-f HOSTFILE needs mpirun; {install_extra('mpi')}, or run torchrun on each host yourself")
    backend = _script_option(req.script_args, "--backend") if Path(req.script).name == "train.py" else None
    if backend:
        env[envvars.BACKEND] = backend  # so bind reserves a CCL worker core when ccl is asked for
    bind = [python, "-m", "corecpu.bind", *bind_opts, "--"]
    script = [python, "-u", *(["-m", req.module] if req.module else [os.path.abspath(req.script)]), *req.script_args]
    if req.log_dir:
        env[envvars.LOG_DIR] = os.path.abspath(req.log_dir)
    for name, value in ((envvars.LOG_REDIRECTS, req.redirects), (envvars.LOG_TEE, req.tee),
                        (envvars.LOG_RANKS_FILTER, req.local_ranks_filter)):
        if value is not None:
            env[name] = value  # corecpu.bind routes each rank's streams (rank_logs.stream_targets)
    if launcher == "mpirun":
        kind = mpi_kind(which("mpirun") or "mpirun")
        family, env[envvars.MPI] = kind.family, kind.label  # the ranks' banner names the MPI that really runs
        env.update(mpirun.mpi4py_library(kind, environ, both_abis()))
        forward = mpirun.forwarded_names(environ, env) if kind.family == mpirun.OPEN_MPI and req.hostfile else []
        cmd, mpi_env, notes = mpirun.command(kind, nranks, local, req.hostfile, hosts, oversubscribe=req.oversubscribe,
                                             as_root=euid() == 0, forward=forward)
        env.update(mpi_env)
        cmd += bind + script
    elif nnodes > 1:  # torchrun on each node, static rendezvous at rank 0's host (torchrun's own meaning)
        env["OMP_NUM_THREADS"] = "1"
        cmd = [python, "-m", TORCHRUN_MODULE, "--nnodes", str(nnodes), "--node-rank", str(req.node_rank),
               "--master-addr", env["MASTER_ADDR"], "--master-port", env["MASTER_PORT"],
               "--nproc-per-node", str(local), "--no-python", *bind, *script]
    else:
        env["OMP_NUM_THREADS"] = "1"  # corecpu.bind replaces it per rank; this silences torchrun's notice
        # As --standalone (one node, a free port, a fresh rendezvous id), but every store on loopback:
        # torchrun through corecpu.launching.torchrun, whose stores for a loopback address listen there.
        # A loopback MASTER_ADDR of the user's (127.0.0.2) is kept; any other would open the stores to the network.
        addr = loopback_ip(env["MASTER_ADDR"])
        if addr is None:
            warnings.append(f"MASTER_ADDR={env['MASTER_ADDR']} is not a loopback address; a one-host torchrun "
                            "job keeps its stores on 127.0.0.1, unreachable from the network (use -f HOSTFILE "
                            "with mpirun, or --nnodes and --node-rank, for several hosts)")
            addr = "127.0.0.1"
        cmd = [python, "-m", TORCHRUN_MODULE, "--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
               f"{addr}:0", "--rdzv-id", f"corecpu-{os.getpid()}", "--local-addr", addr,
               "--nproc-per-node", str(local), "--no-python", *bind, *script]
    return LaunchPlan(cmd, env, local, warnings, notes, family)


def user_cpu_restriction(affinity: Iterable[int], cpuset: Iterable[int]) -> str | None:
    """The CPU list a user narrowed the launcher to (`taskset -c 1 ./launch.sh 1`, `numactl -C`), or None.

    corecpu.bind plans each rank from the cgroup's cpuset, not from its own mask, because mpirun may already
    have pinned it narrower; so a restriction that only the launcher's mask carries must be passed on, or a rank
    started under `taskset -c 1` is planned on CPUs 0-1. Nothing has pinned the launcher but its user."""
    mine, whole = set(affinity), set(cpuset)
    narrowed = mine & whole
    return format_cpu_list(sorted(narrowed)) if narrowed and narrowed < whole else None


def usable_cores(topology) -> int:  # noqa: ANN001 - a corecpu.cpu.topology.Topology
    """The physical cores this process may use: what corecpu plan gives ranks without --oversubscribe."""
    allowed = set(topology.allowed)
    return sum(1 for core in topology.cores if allowed.intersection(core.cpus)) or len(allowed)


def _script_option(args: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def settle_batch(req: LaunchRequest, cores: int, node_cpus: int, env: Mapping[str, str]) -> str | None:
    """`auto` and `--global-batch-size`: set req's rank count and train.py's per-rank --batch-size. Returns the
    auto decision's line ("" without auto), or None when a dry run of auto has said what it would measure."""
    if not (req.auto or req.global_batch):
        return ""
    from corecpu.launching import auto_ranks  # it reads train.py's flags, which loads torch: only when asked

    if not req.auto:
        per = auto_ranks.fixed_ranks_batch(req.script_args, req.nranks, req.global_batch)  # type: ignore[arg-type]
        req.script_args = [*req.script_args, "--batch-size", str(per)]
        return ""
    auto_ranks.refuse(req.script_args, req.hostfile, req.nnodes)
    trial = (auto_ranks.dry_trial if req.dry_run else
             auto_ranks.subprocess_trial(req.script, req.module, req.launcher, env))
    choice = auto_ranks.choose(req.script_args, req.global_batch, cores, node_cpus,
                               env.get(envvars.BINDING, "core"), env, trial, print if req.dry_run else _say)
    if choice is None:
        return None
    req.nranks = choice.ranks
    req.script_args = [*req.script_args, "--batch-size", str(choice.batch_size)]
    _say(f"corecpu launch: {choice.line()}")
    return choice.line()


def run_forwarding_signals(command: list[str], env: dict[str, str], launcher: str,
                           output_dir: str | None = None) -> int:
    """Run the launcher as a child and stay the process a scheduler or a person signals.

    SIGTERM (scancel, pod eviction), SIGINT (Ctrl-C) and SIGUSR1 (sbatch --signal=USR1@60) are
    forwarded to the launcher, which passes them to every rank: the ranks stop at the next step,
    save and exit 75. SIGHUP (the terminal went away) goes on as itself, as SIGTERM to mpirun. The child runs in its
    own process group, so a terminal's Ctrl-C reaches it only through here (mpiexec.hydra aborts
    without saving on a second one, so a second signal goes to the ranks themselves). Ranks watch
    this PID and exit if it is killed outright. The job ends within a bounded grace of a stop
    signal, and a rank that ends badly ends it at once, named (job_watch: `output_dir`, where a
    job that exited without saving has its checkpoints). A rank whose watchdog found the job hung
    sends END_JOB_SIGNAL; what is left of the job after END_JOB_GRACE_S is killed (a stopped rank
    on another host included) and the exit code is EXIT_HUNG. Nothing of the job outlives this.
    Returns the launcher's exit code (128+N if a signal killed it).
    """
    stale = ccl_shm.remove_stale_regions()
    if stale:
        _say(f"corecpu launch: removed {len(stale)} oneCCL shared-memory region(s) from /dev/shm that ended jobs "
             f"had left ({', '.join(stale[:4])}{', ...' if len(stale) > 4 else ''})")
    job_dir = job_watch.make_job_dir()
    env = {**env, envvars.LAUNCHER_PID: str(os.getpid()), envvars.JOB_DIR: str(job_dir)}
    job_watch.become_subreaper()
    # A rank may signal this process (END_JOB_SIGNAL) or a person may (Ctrl-C) before the handlers below exist:
    # held until they do, then handled (a loaded CI machine once killed the launcher with an early SIGUSR2).
    held = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
    try:
        child = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, preexec_fn=_launcher_child)
    except OSError as exc:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        shutil.rmtree(job_dir, ignore_errors=True)
        raise CoreCPUError(f"cannot start {command[0]}: {exc.strerror}; check that it is installed") from None
    # torchrun's agent already ends the job when a worker fails, and names it (corecpu.launching.torchrun).
    # Open MPI prints its own report of a rank's exit 75 after the stop line: the watch says that line again, last.
    watch = job_watch.JobWatch(job_dir, child.pid, _say, output_dir,
                               end_on_failure=launcher in ("mpirun", mpirun.OPEN_MPI),
                               restate_stop=launcher == mpirun.OPEN_MPI).start()

    def forward(signum: int, _frame: object) -> None:
        sig, target = signum, child.pid
        if launcher == "mpirun" and sig == signal.SIGHUP:  # hydra dies of SIGHUP without passing it on
            sig = signal.SIGTERM
            print("corecpu launch: SIGHUP received; passed to the ranks as SIGTERM (Intel MPI does not forward "
                  "SIGHUP): they stop after this step and save", file=sys.stderr, flush=True)
        if not watch.stop_signal(sig):
            return  # a second one: the watch passes it to the ranks themselves
        if launcher == mpirun.OPEN_MPI and watch.signal_ranks(sig):
            # Open MPI would pass SIGINT on as SIGTERM and exit 1 even when the ranks saved. The ranks on this
            # host hear the signal itself; they agree on the stop with the others at the next step (preempt).
            return
        if launcher == "mpirun":
            # mpirun is a shell script around mpiexec.hydra, which is the one that forwards to the ranks.
            target = next(iter(_children(child.pid, "mpiexec.hydra")), child.pid)
        elif sig == signal.SIGUSR1:
            sig = signal.SIGTERM  # torchrun's agent forwards SIGTERM to every worker, not SIGUSR1
        try:
            os.kill(target, sig)
        except ProcessLookupError:
            pass

    torn_down = threading.Event()

    def tear_down() -> None:
        if child.poll() is None:
            torn_down.set()
            job_watch.kill_job(keep=child.pid)

    def end_job(_signum: int, _frame: object) -> None:
        # A rank's watchdog found the job hung and said which rank, in one line. The ranks it could reach are
        # gone within seconds; a stopped one on another host is not, and hydra waits for it. Killing the
        # launcher's processes (mpirun, mpiexec.hydra, this host's proxy and ranks) drops each remote
        # proxy's link, and its ranks die with it (PDEATHSIG, which a stopped process obeys).
        watch.job_hung()
        if not timers:
            timers.append(threading.Timer(END_JOB_GRACE_S, tear_down))
            timers[0].daemon = True
            timers[0].start()

    timers: list[threading.Timer] = []
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP):
        signal.signal(signum, forward)
    signal.signal(END_JOB_SIGNAL, end_job)
    signal.pthread_sigmask(signal.SIG_SETMASK, held)  # what arrived meanwhile is handled now
    code = 1
    try:
        code = child.wait()  # PEP 475: retried after each forwarded signal until the child exits
    finally:
        for timer in timers:
            timer.cancel()
        _remove_ranks_ccl_shm(job_dir)
        code = watch.finish(128 - code if code < 0 else code)
    return EXIT_HUNG if torn_down.is_set() and watch.code is None else code


def _remove_ranks_ccl_shm(job_dir: Path) -> None:
    """The oneCCL regions of this host's ranks that ended without removing them (killed with their supervisor)."""
    host = socket.gethostname()
    pids = [rec.pid for rec in job_records.read(job_dir).values() if rec.pid and rec.host == host]
    # The job's ranks end with it, but one killed by PDEATHSIG may still be exiting: a short wait, not a
    # check, or its region stays (one that outlives the wait is left to the next launch's stale sweep).
    for pid in ccl_shm.wait_gone(pids, RANK_EXIT_WAIT_S):
        ccl_shm.remove_regions(pid)


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


# Slurm's scancel (and a job's time limit) signals every process of the step at once. impi-rt's
# `mpirun` is a /bin/sh wrapper around mpiexec.hydra that dies of SIGTERM, and its death ended the
# job before the ranks could save. A shell started with a signal ignored cannot handle it again, so
# the wrapper survives; mpiexec.hydra installs its own handlers and forwards to the ranks, as
# torchrun's agent does; this process forwards what it receives.
LAUNCHER_IGNORES = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP)
HANDLED = (*LAUNCHER_IGNORES, END_JOB_SIGNAL)  # what run_forwarding_signals handles, held until it can


def _launcher_child() -> None:
    """In the launcher's child, before exec: its own process group, the stop signals ignored, none held (the
    parent holds them while it starts this child)."""
    os.setpgrp()
    for signum in LAUNCHER_IGNORES:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)


def _children(pid: int, name: str) -> list[int]:
    """PIDs of `pid`'s children called `name` (from /proc: no pgrep needed)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
        if comm == name and int(rest[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def main(argv: Sequence[str] | None = None, default_script: str | None = None) -> NoReturn:
    def run() -> int:
        args = list(sys.argv[1:] if argv is None else argv)
        script = default_script
        if args[:1] == ["--default-script"]:  # launch.sh: train.py unless a SCRIPT.py is given
            script, args = args[1], args[2:]
        req = parse_args(args, script)
        # impi-rt installs mpirun beside this interpreter; an installed `corecpu` may run without it on PATH.
        bindir = str(Path(sys.executable).parent)
        if bindir not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
        cpuset = read_topology(allowed_from_cpuset=True, env=os.environ)
        restricted = None if req.hostfile or (req.nnodes or 1) > 1 else user_cpu_restriction(
            os.sched_getaffinity(0), cpuset.allowed)  # other hosts' CPUs are not this process's to narrow
        topology = read_topology(allowed_cpus=restricted, env=os.environ) if restricted else cpuset
        binding: dict[str, str] = {}
        if not req.hostfile and envvars.BINDING not in os.environ:
            # Measured here, before any rank exists (their start-up would look like load). One host only: each
            # host of a multi-host job decides in corecpu.bind from its own signs.
            train = Path(req.script).name == "train.py" and not req.module
            asked = (_script_option(req.script_args, "--binding") if train else None) or "auto"
            evidence = gather_evidence(os.environ, topology.allowed, len(topology.online), measure=not req.dry_run)
            binding[envvars.BINDING], binding[envvars.BINDING_REASON] = decide_binding(asked, evidence)
            if evidence.measured:  # the ranks time their all-reduce paths per load state (distributed.gradient_path)
                binding[envvars.CPUS_BUSY] = format_cpu_list(evidence.busy_cpus)
        decided = settle_batch(req, usable_cores(topology), len(cpuset.allowed), {**os.environ, **binding})
        if decided is None:
            return 0  # --dry-run with auto: it said what it would measure
        plan = plan_launch(req, os.environ, sys.executable, usable_cores(topology), allowed_cpus=restricted)
        plan.env.update(binding)
        if decided:
            plan.env[envvars.RANKS_DECISION] = decided
        if req.hostfile and not req.dry_run and (problem := unresolved_host(req.hostfile, read_hostfile(req.hostfile))):
            raise CoreCPUError(problem)
        for w in plan.warnings:
            print(f"corecpu launch: warning: {w}", file=sys.stderr, flush=True)
        for note in plan.notes:
            print(f"corecpu launch: {note}", file=sys.stderr, flush=True)
        env = {**os.environ, **plan.env}
        if req.dry_run:
            env = plan.env
        if sys.stdout.isatty():
            env[envvars.TTY] = "1"  # ranks write into the launcher's pipes; rank 0 may still draw progress
        if req.dry_run:
            print("# environment")
            for k, v in env.items():
                print(f"export {k}={shlex.quote(v)}")
            print("# command")
            print(shlex.join(plan.command))
            print(f"# this host's plan for {plan.local_ranks} local rank(s)")
            request = PlanRequest(nproc=plan.local_ranks, allow_oversubscribe="--oversubscribe" in plan.command,
                                  binding=plan.env.get(envvars.BINDING, "core"),
                                  allocator=os.environ.get(envvars.ALLOCATOR, "auto"))
            try:
                sys.stdout.write(make_plan(detect_topology(), request).to_shell())
            except CoreCPUError as exc:  # the command above is still worth seeing
                print(f"corecpu: error: {exc}", file=sys.stderr)
            return 0
        if too_small := address_space.too_small():  # every rank inherits it: refuse before one starts
            raise CoreCPUError(too_small)
        train = Path(req.script).name == "train.py"
        output_dir = (_script_option(req.script_args, "--output-dir") or TRAIN_OUTPUT_DIR) if train else None
        # "mpirun" is hydra's (Intel MPI, MPICH); Open MPI's is handled apart (run_forwarding_signals)
        launcher = "torchrun" if plan.mpi_family is None else (
            mpirun.OPEN_MPI if plan.mpi_family == mpirun.OPEN_MPI else "mpirun")
        code = run_forwarding_signals(plan.command, env, launcher, output_dir)
        if code != 0 and req.log_dir:
            print("\n".join([f"corecpu launch: the job failed (exit {code}); rank logs in {req.log_dir}",
                             *failure_summary(req.log_dir)]), file=sys.stderr, flush=True)
        return code

    run_cli(run)


if __name__ == "__main__":
    main()
