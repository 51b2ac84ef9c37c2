"""Listening sockets of a job: a single-host job listens on loopback only.

Intel MPI's `hydra_pmi_proxy` opens a TCP listener on 0.0.0.0 (an ephemeral port, for PMI
clients that connect by port instead of the PMI_FD socket pair every rank is given) and
leaves it to every rank it starts, without close-on-exec. No mpirun option moves it
(`-iface lo`, `I_MPI_HYDRA_IFACE=lo` and `-localhost 127.0.0.1` were tried with
impi-rt 2021.18: strace still shows bind(0.0.0.0:0)). The rank holds the same socket, so
`shutdown(SHUT_RD)` in the rank stops it listening for the proxy as well; MPI_Init and
mpi4py's collectives work on without it (they use PMI_FD). Nothing then listens on
another interface, apart from the moment between the proxy's start and its first rank's.

Reading /proc/net/tcp{,6} also lets a rank see a launcher's store listening on every
interface (torchrun's TCPStore always binds `*`), to say so.

Nothing here imports torch.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


@dataclass(frozen=True)
class Listener:
    address: str  # "0.0.0.0", "::", "127.0.0.1", ...
    port: int
    inode: int

    @property
    def wildcard(self) -> bool:
        return ipaddress.ip_address(self.address).is_unspecified

    @property
    def loopback(self) -> bool:
        address = ipaddress.ip_address(self.address)
        mapped = getattr(address, "ipv4_mapped", None)
        return (mapped or address).is_loopback


def listen_on(ip: str, port: int) -> socket.socket:
    """A socket listening on ip:port (0: any free port), for a store that takes one (TCPStore's
    `master_listen_fd`), so it listens where the caller chose and nowhere else."""
    sock = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TCPStore does: TIME_WAIT may linger
    try:
        sock.bind((ip, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


def _address(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    # IPv6: four 32-bit words, each in host (little-endian) order
    return socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))


def parse_proc_net(text: str) -> list[Listener]:
    """Pure: the LISTEN entries of a /proc/net/tcp or tcp6 table."""
    found = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != LISTEN:
            continue
        addr, port = fields[1].split(":")
        found.append(Listener(_address(addr), int(port, 16), int(fields[9])))
    return found


def listeners(proc_net: str = "/proc/net") -> list[Listener]:
    """Every TCP listener in this network namespace (`/proc/PID/net` for another process's)."""
    found: list[Listener] = []
    for name in ("tcp", "tcp6"):
        try:
            found += parse_proc_net((Path(proc_net) / name).read_text())
        except OSError:
            continue
    return found


def socket_inodes(pid: int | str = "self") -> dict[int, int]:
    """socket inode -> fd number, for the sockets process `pid` holds."""
    out: dict[int, int] = {}
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        entries = list(fd_dir.iterdir())
    except OSError:
        return out
    for entry in entries:
        try:
            target = os.readlink(entry)
        except OSError:
            continue
        if target.startswith("socket:["):
            out[int(target[8:-1])] = int(entry.name)
    return out


def launched_by_hydra(env: Mapping[str, str]) -> bool:
    """Started by Intel MPI's (or MPICH's) hydra: its proxy exports these to each rank."""
    return "PMI_FD" in env or "HYDRA_BSTRAP_PROXY_ID" in env


def close_inherited_wildcard_listeners(env: Mapping[str, str]) -> list[Listener]:
    """In a rank started by hydra: stop the proxy's 0.0.0.0 listener we inherited (see the module
    docstring). Only wildcard listeners whose descriptor this process holds from its start are touched;
    returns them."""
    if not launched_by_hydra(env):
        return []
    held = socket_inodes()
    stopped = []
    for listener in listeners():
        fd = held.get(listener.inode)
        if fd is None or not listener.wildcard:
            continue
        sock = socket.socket(fileno=fd)
        try:
            # On a listening TCP socket, SHUT_RD disconnects it: it leaves LISTEN for every holder.
            sock.shutdown(socket.SHUT_RD)
            stopped.append(listener)
        except OSError:
            pass
        finally:
            sock.detach()  # the descriptor stays open: hydra's poll loop still owns it
    return stopped


def wildcard_listener_on(port: int, found: Iterable[Listener] | None = None) -> Listener | None:
    """A listener on `port` bound to every interface, if any (e.g. torchrun's store)."""
    for listener in listeners() if found is None else found:
        if listener.port == port and listener.wildcard:
            return listener
    return None
