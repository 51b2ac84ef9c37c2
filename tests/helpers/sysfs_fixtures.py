"""Fake /sys trees (and cgroup trees) for topology tests, generated instead of checked in.

    python tests/helpers/sysfs_fixtures.py OUTDIR    # writes OUTDIR/<name>/ for every named machine

Each tree is laid out like /sys: ROOT/devices/system/cpu/..., ROOT/devices/system/node/...
A `cpuinfo` file beside `devices/` carries the model name and flags (pass it as --cpuinfo).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":  # run as a script from anywhere: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from corecpu.cpu.cpulist import format_cpu_list# noqa: E402

XEON_FLAGS = "fpu sse sse2 avx avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def make_sysfs(
    root: str | Path,
    *,
    sockets: int = 2,
    cores_per_socket: int = 4,
    threads_per_core: int = 2,
    nodes_per_socket: int = 1,
    numbering: str = "linear",
    core_id_stride: int = 1,
    l3: str | None = "socket",
    offline: tuple[int, ...] = (),
    model: str = "Intel(R) Xeon(R) Platinum 8480+ (fake)",
    flags: str = XEON_FLAGS,
) -> Path:
    """A machine of sockets x cores x threads.

    numbering "linear": physical cores first, socket by socket, then the second
    hyperthreads in the same order (0-7 physical, 8-15 siblings on 2x4x2).
    numbering "alternate": consecutive CPUs alternate sockets (even on socket 0, odd
    on socket 1), siblings again after all physical cores.
    """
    root = Path(root)
    S, C, T = sockets, cores_per_socket, threads_per_core
    per_node = C // nodes_per_socket
    layout: dict[int, tuple[int, int, int]] = {}  # cpu -> (socket, core, thread)
    for s in range(S):
        for c in range(C):
            for t in range(T):
                p = s * C + c if numbering == "linear" else c * S + s
                layout[t * S * C + p] = (s, c, t)
    online = [cpu for cpu in sorted(layout) if cpu not in offline]
    cpu_dir = root / "devices/system/cpu"
    _write(cpu_dir / "online", format_cpu_list(online))
    _write(cpu_dir / "possible", format_cpu_list(layout))

    def node_of(s: int, c: int) -> int:
        return s * nodes_per_socket + c // per_node

    for cpu in online:
        s, c, _ = layout[cpu]
        siblings = [x for x in online if layout[x][:2] == (s, c)]
        topo = cpu_dir / f"cpu{cpu}/topology"
        _write(topo / "physical_package_id", str(s))
        _write(topo / "core_id", str(c * core_id_stride))
        _write(topo / "thread_siblings_list", format_cpu_list(siblings))
        cache = cpu_dir / f"cpu{cpu}/cache"
        for index, level in enumerate((1, 1, 2)):
            _write(cache / f"index{index}/level", str(level))
            _write(cache / f"index{index}/shared_cpu_list", format_cpu_list(siblings))
        if l3:
            sharing = [x for x in online if layout[x][0] == s and (l3 == "socket" or node_of(*layout[x][:2]) == node_of(s, c))]
            _write(cache / "index3/level", "3")
            _write(cache / "index3/shared_cpu_list", format_cpu_list(sharing))
    for n in range(S * nodes_per_socket):
        cpus = [x for x in online if node_of(*layout[x][:2]) == n]
        _write(root / f"devices/system/node/node{n}/cpulist", format_cpu_list(cpus))
    _write(root / "cpuinfo", f"processor\t: 0\nmodel name\t: {model}\nflags\t\t: {flags}\n")
    return root


def make_cgroup(root: str | Path, quota_cpus: float | None, *, version: int = 2, period: int = 100000) -> tuple[Path, Path]:
    """A cgroup mount with a CPU quota, and the /proc/self/cgroup file that points into it."""
    root = Path(root)
    proc = root / "proc_self_cgroup"
    if version == 2:
        _write(root / "cgroup.controllers", "cpuset cpu io memory pids")
        _write(root / "cpu.max", "max 100000" if quota_cpus is None else f"{int(quota_cpus * period)} {period}")
        _write(proc, "0::/")
    else:
        d = root / "cpu,cpuacct"
        _write(d / "cpu.cfs_quota_us", "-1" if quota_cpus is None else str(int(quota_cpus * period)))
        _write(d / "cpu.cfs_period_us", str(period))
        _write(proc, "4:cpu,cpuacct:/\n3:cpuset:/")
    return root, proc


# The machines the tests (and the docs' sample output) use.
MACHINES: dict[str, dict] = {
    "two_socket": dict(sockets=2, cores_per_socket=4, threads_per_core=2),
    "alternate": dict(sockets=2, cores_per_socket=4, threads_per_core=2, numbering="alternate", core_id_stride=2),
    "snc": dict(sockets=2, cores_per_socket=4, threads_per_core=2, nodes_per_socket=2, l3="node"),
    "single_core": dict(sockets=1, cores_per_socket=1, threads_per_core=1, l3=None,
                        model="Intel(R) Xeon(R) CPU (fake, 1 core)", flags="fpu sse sse2 avx avx2"),
}


def make_machine(root: str | Path, name: str) -> Path:
    return make_sysfs(root, **MACHINES[name])


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "fake-sysfs")
    for name in MACHINES:
        print(make_machine(out / name, name))
