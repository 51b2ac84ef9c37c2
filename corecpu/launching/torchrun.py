"""torchrun whose stores listen on loopback when their address is a loopback one.

    python -m corecpu.launching.torchrun [torchrun's options] CMD ...

torch's TCPStore server binds every interface (`*`, IPv4 and IPv6) whatever host name it is
given, so plain `torchrun --standalone` (or `--rdzv-endpoint 127.0.0.1:PORT`, or
`--master-addr 127.0.0.1`) leaves its rendezvous store and its workers' store open to the
network. TCPStore does take an already listening socket (`master_listen_fd`, as corecpu's
own store uses): this runs torchrun's own main with every store server it creates for a
loopback address handed a socket bound to that address and port. Stores for other
addresses (several nodes) are left as torchrun makes them.

`corecpu launch --launcher torchrun` (and launch.sh where there is no mpirun) runs this,
single-host, with `--local-addr 127.0.0.1` so that the workers' store is on loopback too.

A rank that fails ends the job with one line naming it, then torchrun's summary; torchrun's
own main would wrap that summary in a traceback of its internals, and its agent would stop
the other ranks with SIGTERM (see kill_survivors_of_a_failure). A stop signal to the agent
ends it with 75 when every rank saved (torchrun's own: a SignalException traceback and 1).
"""

from __future__ import annotations

import ipaddress
import shutil
import signal
import socket
import sys
from pathlib import Path
from typing import Any, Sequence

from corecpu.cluster.listeners import listen_on
from corecpu.launching.job_watch import make_job_dir

EXIT_STOPPED = 75  # a rank stopped on request and saved (corecpu.reliability.preempt.EXIT_STOPPED; torch-free here)
# TCPStore(host_name, port, world_size, is_master, timeout, wait_for_workers, multi_tenant, master_listen_fd, use_libuv)
_POSITIONAL = ("host_name", "port", "world_size", "is_master", "timeout", "wait_for_workers", "multi_tenant",
               "master_listen_fd", "use_libuv")


def loopback_ip(host: str) -> str | None:
    """The loopback address to bind for `host`, or None when `host` is not (only) this machine's loopback."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return None
    ips = [str(info[4][0]) for info in infos]
    if not ips or not all(ipaddress.ip_address(ip).is_loopback for ip in ips):
        return None
    return next((ip for ip in ips if ":" not in ip), ips[0])  # "localhost": 127.0.0.1 rather than ::1


def loopback_store_arguments(args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """TCPStore's arguments as keywords, with a loopback listening socket for a loopback server."""
    bound = {**dict(zip(_POSITIONAL, args)), **kwargs}
    ip = loopback_ip(str(bound.get("host_name", "")))
    if bound.get("is_master") and bound.get("master_listen_fd") is None and ip is not None:
        bound["master_listen_fd"] = listen_on(ip, int(bound.get("port", 0))).detach()
    return bound


def patch_tcpstore() -> None:
    """Make torch.distributed.TCPStore (and every `from torch.distributed import TCPStore` after this)
    bind loopback servers to loopback. Must run before torch.distributed.run is imported."""
    import torch.distributed as dist  # here: the rest of corecpu.launching is torch-free

    base = dist.TCPStore

    class LoopbackTCPStore(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(**loopback_store_arguments(args, kwargs))

    dist.TCPStore = LoopbackTCPStore  # type: ignore[misc]


def failed_rank_line(rank: int, exitcode: int, pid: int, host: str) -> str:
    """Pure: the one line naming the rank whose end ended the job."""
    if exitcode < 0:
        try:
            how = f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"was killed by signal {-exitcode}"
    elif exitcode == EXIT_STOPPED:  # not an error: the ranks saved and stopped (stopped.json says where)
        return f"corecpu: rank {rank} (pid {pid}) on {host} stopped on request (exit 75); torchrun ended the job"
    else:
        how = f"exited with code {exitcode}"
    return f"corecpu: error: rank {rank} (pid {pid}) on {host} {how}; torchrun ended the job"


_closed_codes: dict[int, int | None] = {}  # local rank -> exit code, as the agent's last close() left them


def stopped_code(codes: dict[int, int | None], signum: int) -> int:
    """Pure: torchrun's exit code after a stop signal reached its agent. 75 when every worker stopped on request
    and saved (as under mpirun: a requeue rule needs it), else 128+N, as a shell reports a signal."""
    if codes and all(code == EXIT_STOPPED for code in codes.values()):
        return EXIT_STOPPED
    return 128 + signum


def kill_survivors_of_a_failure() -> None:
    """When a rank fails, torchrun's agent stops the others with SIGTERM: corecpu's ranks take that for a stop
    request, announce a checkpoint they cannot write (it needs every rank), and print a traceback when their
    next collective meets the dead peer. Stop them with SIGKILL instead, as hydra does (SIGTERM as before when
    the rank stopped on request, exit 75: its peers are saving the same stop); a stop signal sent to the agent
    itself still reaches the ranks as that signal (torchrun's own shutdown path, untouched)."""
    import logging

    from torch.distributed.elastic.multiprocessing import api  # torch only here: see patch_tcpstore

    # The agent's poll closes the other workers with close() and no signal the moment one fails
    # (api.PContext._poll); its shutdown on a signal it received passes that signal, and is left as it is.
    close = api.PContext.close

    def close_failed(self: api.PContext, death_sig: signal.Signals | None = None, timeout: int = 30) -> None:
        if death_sig is None:
            failures = getattr(self, "_failures", {}).values()
            # A rank that stopped on request (75) has peers saving the same stop: they get SIGTERM, as before.
            failed = [f for f in failures if f.exitcode != EXIT_STOPPED]
            death_sig = signal.SIGKILL if failed else signal.SIGTERM
        close(self, death_sig, timeout)

        handlers = getattr(self, "subprocess_handlers", {}) or {}
        _closed_codes.update({rank: h.proc.returncode for rank, h in handlers.items()})

    api.PContext.close = close_failed  # type: ignore[method-assign]
    # Its "Sending process N closing signal" and "failed (exitcode: -9)" lines: the summary below says it once.
    logging.getLogger(api.__name__).setLevel(logging.CRITICAL)


def one_stop_signal() -> None:
    """The agent's handler raises SignalException on every delivery. scancel signals every process, the agent
    included, and corecpu launch forwards the same signal: a second delivery lands inside the agent's handling
    of the first (seen: in its own logger.warning, printed as a logging traceback) and cuts its shutdown short.
    Raise once; the shutdown already under way passes the signal to the workers and waits for their save."""
    from torch.distributed.elastic.multiprocessing import api  # torch only here: see patch_tcpstore

    first = api._terminate_process_handler
    raised: list[int] = []

    def raise_once(signum: int, frame: object) -> None:
        if not raised:
            raised.append(signum)
            first(signum, frame)  # type: ignore[arg-type]

    # The agent installs it by its module-global name when it starts the workers (api.PContext.start).
    api._terminate_process_handler = raise_once  # type: ignore[assignment]


def main(argv: Sequence[str] | None = None) -> None:
    patch_tcpstore()
    kill_survivors_of_a_failure()
    one_stop_signal()
    # After the patch: torchrun's modules import TCPStore by name.
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    sys.argv[0] = "torchrun"  # its usage and error lines name torchrun
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    # Without --log-dir torchrun makes /tmp/torchelastic_*/ (a tree of per-rank directories for its workers'
    # error files) and never removes it, one per launch. Given one of our own, it is removed when the job ends,
    # unless a worker wrote an error file there (torchrun's summary names it), and by the next launch when this
    # agent was killed outright.
    own_log_dir = None if args.log_dir else str(make_job_dir(kind="torchrun"))
    args.log_dir = args.log_dir or own_log_dir
    try:
        run(args)
    except ChildFailedError as exc:
        # torchrun's own main (@record) lets this escape as a traceback of its internals around the summary:
        # one line naming the rank, then the summary, and torchrun's exit code (1).
        rank, failure = exc.get_first_failure()
        print(failed_rank_line(rank, failure.exitcode, failure.pid, socket.gethostname()), file=sys.stderr)
        print(exc.format_msg().strip("\n"), file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    except SignalException as exc:
        # The agent passed the signal to every worker and waited for them (scancel signals every process, the
        # agent included); torchrun's own main prints this as a traceback and exits 1. The ranks said the rest.
        raise SystemExit(stopped_code(_closed_codes, int(exc.sigval))) from None
    finally:
        if own_log_dir and not any(p.is_file() for p in Path(own_log_dir).rglob("*")):
            shutil.rmtree(own_log_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
