"""Process-group set-up and teardown for whatever launcher started us.

Start-up and steady state get different timeouts: gloo's default of 30 minutes
means a rank that never arrives (wrong MASTER_ADDR, a crashed host) hangs the
job for half an hour before anyone hears of it. Rendezvous therefore goes
through a TCPStore with a short, configurable timeout and an error that says
what is missing; collectives keep a long one, because rank 0 writing a
checkpoint legitimately keeps the others waiting at a barrier (after the first
step corecpu.reliability.watchdog lowers it).

Start-up is bounded by the wall clock, not by TCPStore's own timeouts: the name
is resolved first, the other ranks wait for rank 0's port in Python (one
attempt, retried until the deadline), and the store and process group are made
in a thread that is abandoned at the deadline (a TCPStore client talking to some
other program's listener waits forever). c10d's C++ logging is silenced for the
duration. Rank 0 opens the listening socket itself, so when every rank is on
this host the store listens on MASTER_ADDR (loopback) only.

A default process group that exists before setup() (Ray Train's TorchTrainer makes one in every
worker) is used as it is, never made twice, and left to whoever made it: teardown() destroys only
the group corecpu created.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import ipaddress
import logging
import os
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Callable, Iterable, Iterator, Mapping, MutableMapping, TypeVar

import torch
import torch.distributed as dist

from corecpu.distributed import BACKENDS
from corecpu.distributed.ccl_env import apply_ccl_env
from corecpu.errors import CoreCPUError
from corecpu.cpu.hardware import CCL, Extension, ccl_installed, ccl_status, installed_version
from corecpu.cluster import ccl_shm, job_records
from corecpu.cluster.launchers import LaunchInfo, detect_launcher
from corecpu.cluster.listeners import listen_on, wildcard_listener_on

log = logging.getLogger("corecpu")

DEFAULT_MASTER_PORT = 29500
DEFAULT_STARTUP_TIMEOUT_S = 120.0
COLLECTIVE_TIMEOUT = timedelta(minutes=30)
T = TypeVar("T")


@dataclass(frozen=True)
class ProcessGroup:
    """What init_distributed made. Who this rank is stays in LaunchInfo (and Run), not here."""

    backend: str  # "none" for a single process without a process group
    backend_reason: str
    master_addr: str
    master_port: int
    # The rendezvous store (a TCPStore served by rank 0): the watchdog publishes heartbeats in it.
    store: Any = field(default=None, compare=False, repr=False)
    # --backend auto found ccl usable but started gloo, because this host's cached measurement sends the
    # gradients another way (see init_distributed's `gloo_instead`).
    ccl_skipped: bool = False


def choose_backend(requested: str, allreduce: str = "auto",
                   status: Callable[[], Extension] = ccl_status) -> tuple[str, str]:
    """The backend to use and why. Asking for one that cannot work is an error, never a silent fallback.

    `allreduce` is the gradient path asked for: `--allreduce gloo` needs a gloo process group (so auto
    picks gloo for it), `--allreduce ccl` a ccl one. `status()` says whether the oneCCL bindings work."""
    if requested not in BACKENDS:
        raise CoreCPUError(f"unknown backend {requested!r}; use one of: {', '.join(BACKENDS)}")
    if requested == "gloo":
        return "gloo", "requested"
    if requested == "mpi":
        if not dist.is_mpi_available():
            raise CoreCPUError(
                "--backend mpi needs a PyTorch built with MPI, and this one is not; use --backend gloo or auto"
            )
        return "mpi", "requested"
    if requested == "auto" and allreduce == "gloo":
        return "gloo", "--allreduce gloo all-reduces gradients on a gloo process group"
    ccl = status()
    if requested == "ccl":
        if not ccl.usable:
            raise CoreCPUError(
                f"--backend ccl needs oneccl_bindings_for_pytorch matching torch ({ccl.reason}); run `corecpu build-ccl` "
                "(or ./launch.sh --with-ccl), or use --backend gloo or auto"
            )
        return "ccl", ccl.reason
    if ccl.usable:
        return "ccl", ccl.reason
    if allreduce == "ccl":
        raise CoreCPUError(f"--allreduce ccl needs the ccl backend, and {ccl.reason}; run `corecpu build-ccl`")
    return "gloo", f"{ccl.reason}; gloo is PyTorch's built-in CPU backend"


def master_address(env: Mapping[str, str], info: LaunchInfo) -> tuple[str, int]:
    """MASTER_ADDR/PORT; else the launcher's hints (Slurm's node list and job id); else
    this host when every rank is on it."""
    addr = env.get("MASTER_ADDR", "") or info.master_addr or ""
    if not addr:
        if info.local_world_size < info.world_size:
            raise CoreCPUError(
                f"MASTER_ADDR is not set but the {info.world_size} ranks span several hosts; "
                "export MASTER_ADDR=<address of the rank-0 host> (launch.sh -f HOSTFILE sets it)"
            )
        addr = "127.0.0.1"
    default_port = DEFAULT_MASTER_PORT if info.master_port is None else info.master_port
    port_text = env.get("MASTER_PORT") or str(default_port)
    try:
        port = int(port_text)
        if not 0 < port < 65536:
            raise ValueError
    except ValueError:
        raise CoreCPUError(f"MASTER_PORT={port_text!r} is not a TCP port; export MASTER_PORT=<1-65535>") from None
    return addr, port


def _iface_addresses() -> dict[str, str]:
    """IPv4 address of each interface, by name (SIOCGIFADDR: no extra dependency, no subprocess)."""
    out: dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue  # interface without an IPv4 address
            out[name] = socket.inet_ntoa(packed[20:24])
    return out


def route_interface(master_addr: str) -> str | None:
    """Name of the interface this host would use to reach `master_addr`.

    A UDP connect() only consults the routing table; it sends nothing.
    """
    try:
        target = socket.gethostbyname(master_addr)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target, 9))
            local_ip = s.getsockname()[0]
    except OSError:
        return None
    for name, ip in _iface_addresses().items():
        if ip == local_ip:
            return name
    return None


def _pin_gloo_interface(env: MutableMapping[str, str], master_addr: str) -> None:
    # gloo otherwise binds to whatever the hostname resolves to, which in
    # containers and namespaces is often an address the peers cannot reach.
    if env.get("GLOO_SOCKET_IFNAME"):
        return
    iface = route_interface(master_addr)
    if iface:
        env["GLOO_SOCKET_IFNAME"] = iface
        log.debug("gloo uses interface %s (the route to %s)", iface, master_addr)


STARTUP_GRACE_S = 5.0  # on top of dist_timeout: the deadline no peer, listener or C++ retry loop can extend


def resolve_master(addr: str) -> str:
    """MASTER_ADDR as an IP address; a name that does not resolve is the user's to fix, so say that."""
    try:
        infos = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise CoreCPUError(f"MASTER_ADDR {addr!r} does not resolve ({exc.strerror}); "
                           "export MASTER_ADDR=<rank 0's host name or IP address>") from None
    # IPv4 first: gloo's interface pinning and most cluster networks speak it.
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    return str(infos[0][4][0])


def store_bind_address(master_ip: str, all_local: bool, local_ips: Iterable[str] | None = None) -> str:
    """Where rank 0's store listens: MASTER_ADDR itself when every rank is on this host (normally loopback,
    unreachable from the network), or when it is one of this host's own non-loopback addresses (the one
    interface the peers reach it by). Every interface only when MASTER_ADDR is not an address of this
    host (NAT) or is a loopback one (/etc/hosts mapping the host name to 127.0.1.1), since the peers'
    route then arrives on an address this host knows by another name."""
    if all_local:
        return master_ip
    own = set(_iface_addresses().values()) if local_ips is None else set(local_ips)
    if master_ip in own and not ipaddress.ip_address(master_ip).is_loopback:
        return master_ip
    return "::" if ":" in master_ip else "0.0.0.0"


def open_agent_store(port: int, find: Callable[[int], object] = wildcard_listener_on) -> str | None:
    """For a single-host torchrun job: the warning to give when torchrun's store on `port` listens on every
    interface (torch's TCPStore binds `*` whatever --master-addr or --rdzv-endpoint says), else None."""
    if find(port) is None:
        return None
    return (f"torchrun's store listens on every interface (port {port}) although every rank is on this host; "
            "start the job with `corecpu launch -n N --launcher torchrun SCRIPT.py` (its stores listen on "
            "127.0.0.1), or keep the port firewalled")


def _probe(ip: str, port: int, deadline: float) -> str | None:
    """Wait until something accepts TCP connections at ip:port. None on success, else the last error.

    Rank 0 may start seconds after the others, so a refused connection is retried until the deadline; this
    replaces TCPStore's own connect loop, which retries once more after its timeout and logs C++ frames.
    """
    last = "no answer"
    pause = 0.01  # rank 0 usually listens within milliseconds of the others (a fixed 0.2 s cost 0.2 s per job)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return last
        try:
            with socket.create_connection((ip, port), timeout=min(remaining, 5.0)):
                return None
        except ConnectionRefusedError:
            last = "connection refused: nothing listens there"
        except socket.timeout:
            last = "no answer: a firewall may drop the packets"
        except OSError as exc:
            last = exc.strerror or type(exc).__name__
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(2 * pause, 0.2)


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence fd 2 for a block: c10d logs each failed attempt with ~20 lines of C++ frames before Python
    even sees the exception; the error corecpu raises afterwards says all that matters in one line."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def call_within(seconds: float, fn: Callable[[], T]) -> tuple[bool, T | None, BaseException | None]:
    """Run `fn` in a daemon thread for at most `seconds`: (finished, result, exception).

    A TCPStore client talking to a listener that is not a TCPStore waits for an answer forever, whatever its
    timeout says; only abandoning the thread bounds that. It stays blocked in C++ until the process exits.
    """
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001  (handed to the caller)
            box["error"] = exc

    thread = threading.Thread(target=run, name="corecpu-rendezvous", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        return False, None, None
    return True, box.get("result"), box.get("error")  # type: ignore[return-value]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _connect(info: LaunchInfo, pg: ProcessGroup, ip: str, startup_timeout_s: float, all_local: bool,
             agent_store: bool, decide: Callable[[dist.Store], tuple[str, str]]) -> tuple[dist.Store, str, str]:
    """Store and process group, within startup_timeout_s + STARTUP_GRACE_S whatever the peers do: (store,
    backend, why). `decide(store)` names the backend once the store exists (every rank must name the same).

    `agent_store`: torchrun's agent already serves a store at MASTER_ADDR:MASTER_PORT; every rank is its client.
    """
    where = f"{pg.master_addr}:{pg.master_port}"
    deadline = time.monotonic() + startup_timeout_s
    listen_fd: int | None = None
    serve = info.rank == 0 and not agent_store
    if serve:
        try:
            listen_fd = listen_on(store_bind_address(ip, all_local), pg.master_port).detach()
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise CoreCPUError(f"MASTER_PORT {pg.master_port} is already in use on this host; "
                                   "export MASTER_PORT=<a free port> (launch.sh picks one when it is unset)") from None
            raise CoreCPUError(f"rank 0 cannot listen on {where} ({exc.strerror}); "
                               "check that MASTER_ADDR names this host") from None
    else:
        problem = _probe(ip, pg.master_port, deadline)
        if problem is not None:
            server = "torchrun's store" if agent_store else "rank 0"
            raise CoreCPUError(f"rank {info.rank} could not reach {server} at {where} within {startup_timeout_s:g}s "
                               f"({problem}); check MASTER_ADDR/MASTER_PORT and that rank 0 is running, "
                               "or raise --dist-timeout")
    stage = {"store": False}

    def rendezvous() -> tuple[dist.Store, str, str]:
        remaining = timedelta(seconds=max(1.0, deadline - time.monotonic()))
        store = dist.TCPStore(ip, pg.master_port, info.world_size, is_master=serve, timeout=remaining,
                              wait_for_workers=True, master_listen_fd=listen_fd)
        stage["store"] = True
        backend, why = decide(store)
        dist.init_process_group(backend, store=store, rank=info.rank, world_size=info.world_size,
                                timeout=COLLECTIVE_TIMEOUT)
        return store, backend, why

    with _quiet_stderr():
        finished, result, error = call_within(deadline - time.monotonic() + STARTUP_GRACE_S, rendezvous)
    if finished and error is None:
        return result  # type: ignore[return-value]
    cause = f" ({_first_line(error)})" if error is not None else ""
    if not serve and not stage["store"]:
        raise CoreCPUError(f"rank {info.rank} reached {where} but no corecpu rank 0 answered there within "
                           f"{startup_timeout_s:g}s{cause}: another program may be listening on MASTER_PORT; "
                           "export MASTER_PORT=<a free port>")
    raise CoreCPUError(f"rank {info.rank} waited {startup_timeout_s:g}s at {where} but not all {info.world_size} ranks "
                       f"arrived{cause}; check that every rank was started with the same MASTER_ADDR/MASTER_PORT, "
                       "or raise --dist-timeout")


def rank0_decides(store: dist.Store, rank: int, key: str, ask: Callable[[], str]) -> str:
    """Rank 0's `ask()`, published under `key` and read by every rank: one answer even where the ranks'
    own views (a cache file another job just rewrote, another host's copy) would differ."""
    if rank == 0:
        store.set(key, ask())
    return store.get(key).decode()


def init_distributed(
    backend: str = "auto",
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    env: MutableMapping[str, str] | None = None,
    info: LaunchInfo | None = None,
    plan_env: Callable[[], Mapping[str, str]] = dict,
    allreduce: str = "auto",
    gloo_instead: Callable[[], str] | None = None,
) -> ProcessGroup:
    """For more than one rank, create the process group. `info` is the launcher detected once by the
    caller (corecpu.setup); without it the environment is read here. `plan_env()` is this node's plan's
    environment where corecpu.bind did not already apply it (oneCCL's worker and transport settings).

    `gloo_instead()`, asked on rank 0 only when `backend` is auto and ccl is usable: a reason to start gloo
    after all ("" for none). A ccl process group costs about a second more to start than a gloo one; when
    the gradients go over another path, it would carry only small control messages, for which gloo is enough.

    Gives up within `startup_timeout_s` (+ a few seconds) whatever the peers do, with one line."""
    env = os.environ if env is None else env
    if startup_timeout_s <= 0:
        raise CoreCPUError(f"dist_timeout must be positive, got {startup_timeout_s:g} seconds")
    info = detect_launcher(env) if info is None else info
    if info.distributed and dist.is_available() and dist.is_initialized():
        return adopt_existing(backend, info, env)  # before any choice: the group's backend is the one in force
    ccl_settings = ""
    if info.distributed and backend in ("auto", "ccl") and allreduce != "gloo" and ccl_installed():
        # Before choose_backend imports the bindings: oneCCL may read its variables as its library loads.
        ccl_settings = apply_ccl_env(env, plan_env, info)
    # auto with the bindings installed may still start gloo (`gloo_instead`); then they are never imported
    # (about 1.4 s here), so that choice waits for the store, where rank 0 makes it for every rank.
    ask = gloo_instead if backend == "auto" and ccl_settings and info.distributed else None
    # Otherwise the choice is made here, so a backend that cannot work is a clear error before any waiting.
    early = choose_backend(backend, allreduce) if ask is None else None
    skipped = []

    def decide(store: dist.Store) -> tuple[str, str]:
        if ask is not None:
            # The restart count keeps an elastic restart (same agent store) from reading the last attempt's answer.
            key = f"corecpu/backend-choice/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
            why = rank0_decides(store, info.rank, key, ask)
            if why:
                skipped.append(True)
                return "gloo", f"{CCL[0]} {installed_version(CCL[1])} is installed, but {why}"
        chosen, reason = early or choose_backend(backend, allreduce)
        if chosen == "ccl":
            import oneccl_bindings_for_pytorch  # noqa: F401  (registers the "ccl" backend)
            reason = f"{reason}; {ccl_settings}"
        return chosen, reason

    if not info.distributed:
        return ProcessGroup("none", "single process", "", 0)
    addr, port = master_address(env, info)
    # Export what was derived, so anything else reading the env:// protocol agrees.
    env.setdefault("MASTER_ADDR", addr)
    env.setdefault("MASTER_PORT", str(port))
    pg = ProcessGroup("", "", addr, port)
    ip = resolve_master(addr)
    if backend in ("auto", "gloo"):
        _pin_gloo_interface(env, addr)
    agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # as torch's own env:// rendezvous reads it
    all_local = info.local_world_size == info.world_size
    if agent_store and all_local and info.rank == 0 and (problem := open_agent_store(port)):
        log.warning(problem)
    store, chosen, reason = _connect(info, pg, ip, startup_timeout_s, all_local, agent_store, decide)
    global _made
    _made = dist.group.WORLD
    job_records.note(env, info.rank, "up")  # `corecpu launch`: start-up is over (a stop signal can now save)
    return replace(pg, backend=chosen, backend_reason=reason, store=store, ccl_skipped=bool(skipped))


def adopt_existing(requested: str, info: LaunchInfo, env: Mapping[str, str]) -> ProcessGroup:
    """The default process group made before setup() (by Ray Train in its workers), checked against the launcher's
    ranks and the backend asked for. Its store carries the watchdog's heartbeats, as corecpu's own would."""
    have, rank, size = dist.get_backend(), dist.get_rank(), dist.get_world_size()
    if (rank, size) != (info.rank, info.world_size):
        raise CoreCPUError(f"a process group of rank {rank} of {size} already exists but {info.launcher} says rank "
                           f"{info.rank} of {info.world_size}; destroy it before setup(), or let one launcher start the ranks")
    if requested not in ("auto", have):
        raise CoreCPUError(f"backend {requested} was asked for, but a {have} process group was made before setup() "
                           f"(under {info.launcher}) and corecpu uses it; ask for backend auto or {have}")
    try:
        from torch.distributed.distributed_c10d import _get_default_store  # private (torch 2.x); used for heartbeats only
        store = _get_default_store()
    except (ImportError, RuntimeError, ValueError):
        store = None  # the watchdog is then off; the collectives still time out
    port = env.get("MASTER_PORT", "")
    job_records.note(env, info.rank, "up")
    return ProcessGroup(have, f"made by {info.launcher} before setup(); used as it is, left open at close",
                        env.get("MASTER_ADDR", ""), int(port) if port.isdigit() else 0, store=store)


_made: object = None  # the default group init_distributed created: the only one teardown() destroys


def teardown() -> None:
    """Destroy the process group corecpu created; one that existed before setup() stays its maker's (Ray Train
    destroys its own when the workers end)."""
    global _made
    if dist.is_available() and dist.is_initialized() and _made is not None and dist.group.WORLD is _made:
        dist.destroy_process_group()
        if "oneccl_bindings_for_pytorch" in sys.modules:
            ccl_shm.remove_regions()  # oneCCL never unlinks them (ccl_shm)
    _made = None


def all_reduce_sum(values: list[float]) -> list[float]:
    """Sum a few scalars over all ranks in one collective (no-op for one process)."""
    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


def gather_objects(obj: object) -> list:
    """Every rank's `obj`, in rank order, on every rank (a one-element list for one process)."""
    if not dist.is_initialized():
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_from_rank0(tensors: Iterable[torch.Tensor]) -> None:
    """Rank 0's values of `tensors`, in place on every rank (no-op for one process)."""
    if dist.is_initialized():
        with torch.no_grad():
            for t in tensors:
                dist.broadcast(t, 0)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
