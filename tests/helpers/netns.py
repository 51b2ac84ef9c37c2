"""Fake hosts on one machine, for real multi-host tests of the mpirun launch path and the cluster benchmark.

``two_hosts()`` builds two Linux network namespaces joined by a veth pair. Inside
each namespace the veth end is called ``cc0`` (same name on both "hosts", so a single
``I_MPI_HYDRA_IFACE``/``GLOO_SOCKET_IFNAME`` value is right everywhere) and the
loopback is up. Nothing is routed to the outside: the namespaces only see each other.

``fake_hosts(n, switch=True, cpus=[...])`` builds n of them (benchmarks/cluster.py): each
host's ``cc0`` is cabled to a port of a Linux bridge in a "switch" namespace, ``cpus``
gives each host its own CPU set (every command entered through the bootstrap script runs
under ``taskset``, so corecpu's plan sees only that host's CPUs), and ``shape(h, mbit)``
puts a token-bucket (tbf) rate on both directions of every host's link: the host's
egress and the switch port's egress towards it, as a full-duplex NIC into a
non-blocking switch.

Intel MPI's hydra is told to reach the second host through a generated
bootstrap-exec script instead of ssh (``I_MPI_HYDRA_BOOTSTRAP=rsh`` +
``I_MPI_HYDRA_BOOTSTRAP_EXEC``). The script maps a host (address, hostname or
namespace name) to its namespace and runs the command there with ``ip netns exec``.

mpirun itself MUST run inside the first namespace (``h.run_in(h.namespaces[0], ...)``
or ``h.cmd_in(...)``): the second host's hydra proxy connects back to mpirun's control
port, which is only reachable over the veth. The same holds for anything that runs
mpirun, e.g. ``launch.sh``: start the script itself in the first namespace and give it
``h.hostfile`` and ``h.env``.

Every command entered through the script (and ``run_in``) also gets its own UTS and
mount namespace, where the hostname is ``cc-node0``/``cc-node1`` and ``/etc/hosts`` is
a private copy that resolves both hostnames to the veth addresses (``/etc/resolv.conf``
is emptied so no lookup leaves the namespace). Without that, both "hosts" would share
the machine's hostname, which usually resolves to 127.0.0.1, and torch's gloo (which
binds to whatever the hostname resolves to unless GLOO_SOCKET_IFNAME is set) would
advertise a loopback address to the peer. Pass ``isolate_hostname=False`` to keep the
machine's hostname and reproduce exactly that misconfiguration.

Usage::

    with two_hosts() as h:
        r = h.run_in(h.namespaces[0],
                     ["mpirun", "-f", str(h.hostfile), "-n", "2", "-ppn", "1", "python", "x.py"],
                     env={"GLOO_SOCKET_IFNAME": h.iface, "MASTER_ADDR": h.master_addr},
                     timeout=120)

Needs root, ``ip`` (iproute2), ``unshare`` and ``mount``; ``two_hosts()`` calls
``pytest.skip`` with the reason when they are missing or ``ip netns add`` is refused
(``unavailable_reason()`` gives the reason without skipping). Namespaces are named
``ccmh<pid>x<n>a``/``b``/... (the switch ``...z``), so parallel test processes do not collide; leftovers of
crashed runs (whose pid is gone) are removed on the next start. Teardown always
kills whatever still runs in the namespaces and deletes them.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

IFACE = "cc0"
DEFAULT_ADDRESSES = ("10.77.0.1", "10.77.0.2")
DEFAULT_HOSTNAMES = ("cc-node0", "cc-node1")
PREFIX = "ccmh"  # corecpu multi-host; also the tmp dir prefix
_NAME_RE = re.compile(rf"^{PREFIX}(\d+)x\d+[a-z]$")
MAX_HOSTS = 8
_TMP_RE = re.compile(rf"^{PREFIX}(\d+)x\d+-")
_counter = itertools.count()

_CMD_TIMEOUT = 20  # seconds, for each ip/setup command


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be used here (not root, no iproute2, refused...)."""


def _run(cmd: Sequence[str], *, check: bool = True, timeout: float = _CMD_TIMEOUT) -> subprocess.CompletedProcess:
    r = subprocess.run(list(cmd), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}")
    return r


def find_mpirun() -> str | None:
    """mpirun of this Python environment (impi-rt), else the one on PATH."""
    here = Path(sys.executable).parent / "mpirun"
    if here.exists():
        return str(here)
    return shutil.which("mpirun")


def _static_reason() -> str | None:
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (iproute2/util-linux needed for network namespaces)"
    return None


def unavailable_reason() -> str | None:
    """Why two_hosts() cannot work here, or None. Probes `ip netns add` once."""
    reason = _static_reason()
    if reason:
        return reason
    probe = f"{PREFIX}{os.getpid()}x{next(_counter)}a"
    try:
        r = _run(["ip", "netns", "add", probe], check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`ip netns add` failed: {e}"
    if r.returncode != 0:
        return f"`ip netns add` is not permitted here: {r.stderr.strip()}"
    _run(["ip", "netns", "del", probe], check=False)
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _netns_list() -> list[str]:
    r = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def _kill_netns_processes(ns: str) -> None:
    """SIGKILL every process still inside namespace ns (all were started by us)."""
    for _ in range(3):
        r = _run(["ip", "netns", "pids", ns], check=False)
        pids = [int(p) for p in r.stdout.split() if p.isdigit() and int(p) != os.getpid()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        # reap the ones that are our own children so they do not linger as zombies
        for pid in pids:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)


def _delete_netns(ns: str) -> None:
    if ns not in _netns_list():
        return
    _kill_netns_processes(ns)
    _run(["ip", "netns", "del", ns], check=False)  # also destroys the veth end inside


def cleanup_stale() -> list[str]:
    """Delete namespaces/tmp dirs of earlier runs whose process is gone. Returns what was removed."""
    removed = []
    for ns in _netns_list():
        m = _NAME_RE.match(ns)
        if m and not _pid_alive(int(m.group(1))):
            _delete_netns(ns)
            removed.append(ns)
    tmp = Path(tempfile.gettempdir())
    for d in tmp.glob(f"{PREFIX}*"):
        m = _TMP_RE.match(d.name)
        if m and d.is_dir() and not _pid_alive(int(m.group(1))):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(str(d))
    return removed


_ENTER_TEMPLATE = """\
#!/bin/sh
# Generated by tests/helpers/netns.py. Hydra bootstrap-exec: called like ssh/rsh as
#   {script} [ssh-style options] HOST COMMAND [ARGS...]
# and runs COMMAND inside HOST's network namespace, with that host's hostname
# and private /etc/hosts + /etc/resolv.conf (own UTS + mount namespace).
while [ $# -gt 0 ]; do
    case "$1" in
        -[bcDEeFIiJLlmOoPpQRSWw]) shift 2 ;;   # ssh options that take a value
        -*) shift ;;                              # -x, -q, -T, -n, ...
        *) break ;;
    esac
done
if [ $# -lt 2 ]; then
    echo "$0: usage: $0 HOST COMMAND [ARGS...]" >&2
    exit 255
fi
host=$1
shift
cpus=
case "$host" in
{cases}
    *) echo "$0: unknown host '$host' (not one of the test namespaces)" >&2; exit 255 ;;
esac
# A host's own CPUs: what its processes (and corecpu's plan, which reads the allowed CPUs) see.
if [ -n "$cpus" ]; then set -- taskset -c "$cpus" "$@"; fi
exec ip netns exec "$ns" unshare --uts --mount /bin/sh -c '
    mount --bind "$1" /etc/hosts || exit 255
    if [ -e /etc/resolv.conf ]; then mount --bind "$2" /etc/resolv.conf || exit 255; fi
    if [ -n "$3" ]; then hostname "$3" || exit 255; fi
    shift 3
    exec "$@"' sh {hosts} {resolv} "$hn" "$@"
"""


@dataclass
class TwoHosts:
    """The fake hosts (two, or fake_hosts' n: the name is kept for the tests that import it)."""
    namespaces: tuple[str, ...]
    addresses: tuple[str, ...]
    hostnames: tuple[str, ...]
    iface: str
    tmpdir: Path
    hostfile: Path  # one address per line (rank 0's host first)
    hostfile_names: Path  # the same hosts by hostname (resolvable only inside the namespaces)
    bootstrap_exec: Path
    env: dict[str, str] = field(default_factory=dict)
    switch: str | None = None  # the bridge's namespace (fake_hosts with switch), else None

    @property
    def master_addr(self) -> str:
        """Address of the first host, where mpirun and rank 0 run."""
        return self.addresses[0]

    def namespace_of(self, host: str) -> str:
        for ns, addr, name in zip(self.namespaces, self.addresses, self.hostnames):
            if host in (ns, addr, name):
                return ns
        raise KeyError(f"{host!r} is none of {self.namespaces + self.addresses + self.hostnames}")

    def cmd_in(self, ns_or_host: str, cmd: Sequence[str]) -> list[str]:
        """argv that runs cmd in that fake host (for your own Popen)."""
        return [str(self.bootstrap_exec), self.namespace_of(ns_or_host), *map(str, cmd)]

    def full_env(self, env: Mapping[str, str | None] | None = None) -> dict[str, str]:
        """os.environ + self.env + env; a None value in env removes that variable."""
        merged = {**os.environ, **self.env, **(env or {})}
        return {k: v for k, v in merged.items() if v is not None}

    def run_in(
        self,
        ns_or_host: str,
        cmd: Sequence[str],
        *,
        env: Mapping[str, str | None] | None = None,
        timeout: float = 120,
        cwd: str | os.PathLike | None = None,
        check: bool = False,
    ) -> subprocess.CompletedProcess:
        """Run cmd in that fake host with full_env(env); output captured as text.

        On timeout the whole process group is SIGKILLed (and teardown later kills
        anything left in the namespaces); subprocess.TimeoutExpired carries the output.
        """
        argv = self.cmd_in(ns_or_host, cmd)
        p = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.full_env(env),
            cwd=cwd,
            start_new_session=True,
        )
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            for ns in self.namespaces:
                _kill_netns_processes(ns)
            out, err = p.communicate()
            raise subprocess.TimeoutExpired(argv, timeout, output=out, stderr=err) from None
        r = subprocess.CompletedProcess(argv, p.returncode, out, err)
        if check:
            r.check_returncode()
        return r


def _hosts_file(addresses: Sequence[str], hostnames: Sequence[str]) -> str:
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
    for addr, name in zip(addresses, hostnames):
        lines.append(f"{addr} {name}")
        # c10d looks peers up by their IPv4-mapped IPv6 address; without these it
        # warns "The hostname of the client socket cannot be retrieved".
        lines.append(f"::ffff:{addr} {name}")
    try:  # keep the machine's own entries (e.g. its hostname -> 127.0.0.1) after ours
        lines += ["", "# from the machine's /etc/hosts", Path("/etc/hosts").read_text()]
    except OSError:
        pass
    return "\n".join(lines) + "\n"


def _check_link(h: TwoHosts) -> None:
    """One TCP connection from host 0 to host 1 over the veth, to fail early and clearly."""
    server = textwrap.dedent(
        f"""
        import socket
        s = socket.create_server(({h.addresses[1]!r}, 0)); print(s.getsockname()[1], flush=True)
        s.settimeout(10); c, _ = s.accept(); c.sendall(b"ok"); c.close()
        """
    )
    srv = subprocess.Popen(
        h.cmd_in(h.namespaces[1], [sys.executable, "-c", server]),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        port = srv.stdout.readline().strip()
        client = f"import socket; print(socket.create_connection(({h.addresses[1]!r}, {port}), 10).recv(2).decode())"
        r = subprocess.run(
            h.cmd_in(h.namespaces[0], [sys.executable, "-c", client]),
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=_CMD_TIMEOUT,
        )
        if r.stdout.strip() != "ok":
            raise RuntimeError(f"veth link check failed: {r.stdout}{r.stderr}")
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            srv.wait(timeout=_CMD_TIMEOUT)
        if srv.poll() is None:
            srv.kill()
            srv.wait()
        srv.stdout.close()
        srv.stderr.close()


def _host_defaults(n: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if n == 2:
        return DEFAULT_ADDRESSES, DEFAULT_HOSTNAMES
    return tuple(f"10.77.0.{i + 1}" for i in range(n)), tuple(f"cc-node{i}" for i in range(n))


def _skip_or_raise(reason: str, skip: bool) -> None:
    if skip:
        import pytest

        pytest.skip(f"multi-host test needs network namespaces: {reason}")
    raise NetnsUnavailable(reason)


def _cable(host_ns: str, iface: str, switch_ns: str | None, port: str, peer_ns: str | None) -> str | None:
    """A veth from host_ns's `iface` to a switch port (or straight to peer_ns's `iface`); an error or None.
    Both ends are created inside their namespaces: no interface ever appears in the root namespace."""
    far = ["name", port, "netns", switch_ns] if switch_ns else ["name", iface, "netns", peer_ns]
    r = _run(["ip", "link", "add", "name", iface, "netns", host_ns, "type", "veth", "peer", *far], check=False)
    if r.returncode != 0:
        return f"cannot create a veth pair: {r.stderr.strip()}"
    if switch_ns:
        _run(["ip", "-n", switch_ns, "link", "set", port, "master", "br0"])
        _run(["ip", "-n", switch_ns, "link", "set", port, "up"])
    return None


@contextlib.contextmanager
def fake_hosts(
    n: int = 2,
    *,
    addresses: Sequence[str] | None = None,
    hostnames: Sequence[str] | None = None,
    prefix_len: int = 24,
    iface: str = IFACE,
    isolate_hostname: bool = True,
    switch: bool | None = None,
    cpus: Sequence[str] | None = None,
    skip: bool = True,
) -> Iterator[TwoHosts]:
    """Create n namespace "hosts"; always torn down on exit.

    switch=None: a direct veth pair for 2 hosts, a bridge ("switch" namespace) for more. cpus: one
    taskset CPU list per host (e.g. ["0", "1", "0", "1"]), applied to every command entered through
    the bootstrap script. skip=True: pytest.skip(reason) when namespaces are unavailable; skip=False:
    raise NetnsUnavailable instead.
    """
    if not 2 <= n <= MAX_HOSTS:
        raise ValueError(f"fake_hosts: n must be 2..{MAX_HOSTS}, got {n}")
    default_addresses, default_names = _host_defaults(n)
    addresses, hostnames = tuple(addresses or default_addresses), tuple(hostnames or default_names)
    if cpus is not None and len(cpus) != n:
        raise ValueError(f"fake_hosts: {len(cpus)} CPU sets for {n} hosts")
    use_switch = n > 2 if switch is None else switch
    reason = unavailable_reason()
    if reason:
        _skip_or_raise(reason, skip)
    cleanup_stale()

    tag = f"{PREFIX}{os.getpid()}x{next(_counter)}"
    namespaces = tuple(f"{tag}{chr(ord('a') + i)}" for i in range(n))
    switch_ns = f"{tag}z" if use_switch else None
    everything = namespaces + ((switch_ns,) if switch_ns else ())
    tmpdir = Path(tempfile.mkdtemp(prefix=f"{tag}-"))
    try:
        for ns in everything:  # same pid and counter => a crashed earlier fixture of ours
            _delete_netns(ns)
        for ns in everything:
            _run(["ip", "netns", "add", ns])
        if switch_ns:
            bridge = _run(["ip", "-n", switch_ns, "link", "add", "br0", "type", "bridge"], check=False)
            if bridge.returncode != 0:
                _skip_or_raise(f"cannot create a bridge: {bridge.stderr.strip()}", skip)
            _run(["ip", "-n", switch_ns, "link", "set", "br0", "up"])
            cables = [(ns, f"p{i}", None) for i, ns in enumerate(namespaces)]
        else:
            cables = [(namespaces[0], "", namespaces[1])]
        for host_ns, port, peer in cables:
            if (error := _cable(host_ns, iface, switch_ns, port, peer)) is not None:
                _skip_or_raise(error, skip)
        for ns, addr in zip(namespaces, addresses):
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{addr}/{prefix_len}", "dev", iface])
            _run(["ip", "-n", ns, "link", "set", iface, "up"])

        hosts = tmpdir / "etc_hosts"
        hosts.write_text(_hosts_file(addresses, hostnames))
        resolv = tmpdir / "etc_resolv.conf"
        resolv.write_text("# empty: no DNS inside the test namespaces\n")
        cases = []
        for i, (ns, addr, name) in enumerate(zip(namespaces, addresses, hostnames)):
            hn = shlex.quote(name) if isolate_hostname else "''"
            cpu = f"; cpus={shlex.quote(cpus[i])}" if cpus else ""
            cases.append(f"    {addr}|{name}|{ns}) ns={ns}; hn={hn}{cpu} ;;")
        script = tmpdir / "netns_bootstrap.sh"
        script.write_text(
            _ENTER_TEMPLATE.format(
                script=script, cases="\n".join(cases),
                hosts=shlex.quote(str(hosts)), resolv=shlex.quote(str(resolv)),
            )
        )
        script.chmod(0o755)
        hostfile = tmpdir / "hostfile"
        hostfile.write_text("".join(f"{a}\n" for a in addresses))
        hostfile_names = tmpdir / "hostfile_names"
        hostfile_names.write_text("".join(f"{n}\n" for n in hostnames))

        env = {
            # hydra starts its proxy on other hosts by running BOOTSTRAP_EXEC HOST CMD...
            # ("rsh" = no ssh-style "-x" before HOST; the script tolerates it anyway)
            "I_MPI_HYDRA_BOOTSTRAP": "rsh",
            "I_MPI_HYDRA_BOOTSTRAP_EXEC": str(script),
            # advertise/bind hydra's control port on the veth address, not on whatever
            # the hostname resolves to (the proxies must connect back to it)
            "I_MPI_HYDRA_IFACE": iface,
        }
        mpirun = find_mpirun()
        if mpirun:
            # impi-rt's mpirun is a sh wrapper that runs `mpiexec.hydra` from PATH
            bindir = str(Path(mpirun).parent)
            env["PATH"] = os.pathsep.join([bindir, os.environ.get("PATH", os.defpath)])

        h = TwoHosts(
            namespaces=namespaces,
            addresses=addresses,
            hostnames=hostnames,
            iface=iface,
            tmpdir=tmpdir,
            hostfile=hostfile,
            hostfile_names=hostfile_names,
            bootstrap_exec=script,
            env=env,
            switch=switch_ns,
        )
        _check_link(h)
        yield h
    finally:
        for ns in everything:
            with contextlib.suppress(Exception):
                _delete_netns(ns)
        shutil.rmtree(tmpdir, ignore_errors=True)


def two_hosts(**kwargs: Any) -> contextlib.AbstractContextManager[TwoHosts]:
    """Two namespace "hosts" joined by a veth pair (fake_hosts(2, ...))."""
    return fake_hosts(2, **kwargs)


def shape(h: TwoHosts, mbit: float | None) -> None:
    """Every host's link at `mbit` Mbit/s each way (token bucket), or unshaped with None.

    The bucket holds 1 ms at the rate, at least 256 KiB: veths hand tbf segments of up to 64 KiB
    (GSO), and a bucket smaller than one segment would drop it. Latency is the veth's own (no netem
    in every kernel): measure it rather than assume it."""
    links = [(ns, h.iface) for ns in h.namespaces]
    if h.switch:
        links += [(h.switch, f"p{i}") for i in range(len(h.namespaces))]
    for ns, dev in links:
        if mbit is None:
            _run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"], check=False)
            continue
        burst = max(int(mbit * 1e6 / 8 / 1000), 256 * 1024)
        _run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
              "rate", f"{mbit}mbit", "burst", str(burst), "latency", "10ms"])


def main(argv: Sequence[str] | None = None) -> int:
    """`python tests/helpers/netns.py CMD...`: run CMD (default: a shell) in the first fake host.

    Handy to debug by hand; everything is removed when CMD exits.
    """
    argv = list(sys.argv[1:] if argv is None else argv) or [os.environ.get("SHELL", "/bin/sh")]
    with two_hosts(skip=False) as h:
        print(f"namespaces={h.namespaces} addresses={h.addresses} hostfile={h.hostfile}", file=sys.stderr)
        print("env: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in h.env.items() if k != "PATH"), file=sys.stderr)
        return subprocess.call(h.cmd_in(h.namespaces[0], argv), env=h.full_env())


if __name__ == "__main__":
    sys.exit(main())
