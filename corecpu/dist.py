"""Process-group set-up and teardown for whatever launcher started us.

Start-up and steady state get different timeouts: gloo's default of 30 minutes
means a rank that never arrives (wrong MASTER_ADDR, a crashed host) hangs the
job for half an hour before anyone hears of it. Rendezvous therefore goes
through a TCPStore with a short, configurable timeout and an error that says
what is missing; collectives keep a long one, because rank 0 writing a
checkpoint legitimately keeps the others waiting at a barrier.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import struct
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterator, Mapping, MutableMapping

import torch
import torch.distributed as dist

from corecpu.errors import CoreCPUError
from corecpu.hardware import ccl_status
from corecpu.launchers import LaunchInfo, detect_launcher

log = logging.getLogger("corecpu")

BACKENDS = ("auto", "gloo", "ccl", "mpi")
DEFAULT_MASTER_PORT = 29500
DEFAULT_STARTUP_TIMEOUT_S = 120.0
COLLECTIVE_TIMEOUT = timedelta(minutes=30)


@dataclass(frozen=True)
class DistContext:
    info: LaunchInfo
    backend: str  # "none" for a single process without a process group
    backend_reason: str
    master_addr: str
    master_port: int

    @property
    def rank(self) -> int:
        return self.info.rank

    @property
    def world_size(self) -> int:
        return self.info.world_size

    @property
    def is_main(self) -> bool:
        return self.info.rank == 0


def choose_backend(requested: str) -> tuple[str, str]:
    """The backend to use and why. Asking for one that cannot work is an error, never a silent fallback."""
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
    ccl = ccl_status()
    if requested == "ccl":
        if not ccl.usable:
            raise CoreCPUError(
                f"--backend ccl needs oneccl_bindings_for_pytorch matching torch ({ccl.reason}); use --backend gloo or auto"
            )
        return "ccl", ccl.reason
    if ccl.usable:
        return "ccl", ccl.reason
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


def _rendezvous(ctx: DistContext, startup_timeout_s: float) -> dist.TCPStore:
    where = f"{ctx.master_addr}:{ctx.master_port}"
    timeout = timedelta(seconds=startup_timeout_s)
    try:
        return dist.TCPStore(
            ctx.master_addr,
            ctx.master_port,
            ctx.world_size,
            is_master=ctx.is_main,
            timeout=timeout,
            wait_for_workers=True,
        )
    except Exception as exc:  # TCPStore raises RuntimeError/DistStoreError/OSError variously
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if ctx.is_main and "in use" in text.lower():
            raise CoreCPUError(
                f"MASTER_PORT {ctx.master_port} is already in use on this host; export MASTER_PORT=<a free port>"
            ) from None
        if ctx.is_main:
            raise CoreCPUError(
                f"rank 0 waited {startup_timeout_s:g}s at {where} but not all {ctx.world_size} ranks arrived ({text}); "
                "check that every rank was started with the same MASTER_ADDR/MASTER_PORT, or raise --dist-timeout"
            ) from None
        raise CoreCPUError(
            f"rank {ctx.rank} could not reach rank 0 at {where} within {startup_timeout_s:g}s ({text}); "
            "check MASTER_ADDR/MASTER_PORT and that rank 0 is running, or raise --dist-timeout"
        ) from None


def init_distributed(
    backend: str = "auto",
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    env: MutableMapping[str, str] | None = None,
    info: LaunchInfo | None = None,
) -> DistContext:
    """For more than one rank, create the process group. `info` is the launcher detected once by the
    caller (corecpu.setup); without it the environment is read here."""
    env = os.environ if env is None else env
    if startup_timeout_s <= 0:
        raise CoreCPUError(f"dist_timeout must be positive, got {startup_timeout_s:g} seconds")
    info = detect_launcher(env) if info is None else info
    chosen, reason = choose_backend(backend)
    if not info.distributed:
        return DistContext(info, "none", "single process", "", 0)
    addr, port = master_address(env, info)
    # Export what was derived, so anything else reading the env:// protocol agrees.
    env.setdefault("MASTER_ADDR", addr)
    env.setdefault("MASTER_PORT", str(port))
    ctx = DistContext(info, chosen, reason, addr, port)
    if chosen == "ccl":
        import oneccl_bindings_for_pytorch  # noqa: F401  (registers the "ccl" backend)
    if chosen == "gloo":
        _pin_gloo_interface(env, addr)
    store = _rendezvous(ctx, startup_timeout_s)
    dist.init_process_group(chosen, store=store, rank=info.rank, world_size=info.world_size, timeout=COLLECTIVE_TIMEOUT)
    return ctx


def teardown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def distributed(
    backend: str = "auto", startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
) -> Iterator[DistContext]:
    """The process group for the body of a `with`; destroyed on every exit path."""
    try:
        yield init_distributed(backend, startup_timeout_s)
    finally:
        teardown()


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


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
