"""What this node's CPUs look like and which of them this process may use.

All I/O lives here; corecpu.cpu.placement turns the frozen `Topology` into a plan without
touching the system. Everything reads from parameters that default to the real
paths, so tests hand in fake sysfs and cgroup trees.

Cores are grouped by what the kernel says (thread_siblings_list, core_id,
physical_package_id, nodeN/cpulist), never by CPU number ranges: BIOSes differ
in whether siblings follow the physical cores or CPUs alternate across sockets.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from corecpu.cpu.cgroups import REAL_CGROUP, quota_threads, read_cpu_quota, read_cpuset, read_file, read_int
from corecpu.cpu.cpulist import format_cpu_list, parse_cpu_list
from corecpu.cpu.hardware import TRACKED_FLAGS, read_cpu_features
from corecpu.errors import CoreCPUError

REAL_SYSFS = "/sys"
AUTO = "auto"

# Allocator preference order; tcmalloc_minimal is what Debian's libtcmalloc-minimal4 ships.
ALLOCATOR_PATTERNS = {
    "tcmalloc": ("libtcmalloc.so", "libtcmalloc.so.*", "libtcmalloc_minimal.so", "libtcmalloc_minimal.so.*"),
    "jemalloc": ("libjemalloc.so", "libjemalloc.so.*"),
    "iomp5": ("libiomp5.so",),
}


# ---------------------------------------------------------------- data


@dataclass(frozen=True)
class Core:
    """One physical core: its online logical CPUs, primary thread first."""

    package: int
    core_id: int
    node: int
    cpus: tuple[int, ...]
    l3: int  # lowest CPU of the L3 domain this core sits in; -1 when sysfs has no cache info


@dataclass(frozen=True)
class Libraries:
    tcmalloc: str | None = None
    jemalloc: str | None = None
    iomp5: str | None = None


@dataclass(frozen=True)
class Topology:
    online: tuple[int, ...]
    cores: tuple[Core, ...]  # ordered by node, then L3 domain, then core: ranks take contiguous runs
    nodes: tuple[tuple[int, tuple[int, ...]], ...]  # (node id, its online CPUs), ascending id
    allowed: tuple[int, ...]  # online CPUs this process may run on
    cpu_quota: float | None  # cgroup CPU bandwidth limit in CPUs; None = unlimited
    model_name: str = "unknown CPU"
    isa_flags: tuple[str, ...] = ()  # tracked flags present (corecpu.hardware.TRACKED_FLAGS)
    isa_known: bool = False
    libraries: Libraries = Libraries()
    numactl: str | None = None
    l3_domains: tuple[tuple[int, ...], ...] = ()
    source_notes: tuple[str, ...] = ()  # caveats from detection, shown with the plan notes

    @property
    def packages(self) -> tuple[int, ...]:
        return tuple(sorted({c.package for c in self.cores}))

    @property
    def node_ids(self) -> tuple[int, ...]:
        return tuple(n for n, _ in self.nodes)

    def node_of(self, cpu: int) -> int:
        for node, cpus in self.nodes:
            if cpu in cpus:
                return node
        raise KeyError(cpu)

    @property
    def quota_threads(self) -> int | None:
        """Busy threads the quota sustains without throttling: 2.5 CPUs -> 2."""
        return quota_threads(self.cpu_quota)

    def summary(self) -> dict:
        allowed = set(self.allowed)
        return {
            "model": self.model_name,
            "sockets": len(self.packages),
            "numa_nodes": {str(n): format_cpu_list(cpus) for n, cpus in self.nodes},
            "cores": len(self.cores),
            "threads": len(self.online),
            "online_cpus": format_cpu_list(self.online),
            "allowed_cpus": format_cpu_list(self.allowed),
            "allowed_cores": sum(1 for c in self.cores if allowed.intersection(c.cpus)),
            "cpu_quota": self.cpu_quota,
            "quota_threads": self.quota_threads,
            "l3_domains": [format_cpu_list(d) for d in self.l3_domains],
            "isa": {f: f in self.isa_flags for f in TRACKED_FLAGS} if self.isa_known else None,
            "tcmalloc": self.libraries.tcmalloc,
            "jemalloc": self.libraries.jemalloc,
            "iomp5": self.libraries.iomp5,
            "numactl": self.numactl,
            "detection_notes": list(self.source_notes),
        }


# ---------------------------------------------------------------- sysfs


def read_sysfs(root: str | Path) -> tuple[tuple[int, ...], tuple[Core, ...], tuple, tuple, tuple[str, ...]]:
    """Online CPUs, cores, NUMA nodes, L3 domains and caveats from a /sys-shaped tree."""
    root = Path(root)
    cpu_dir = root / "devices/system/cpu"
    notes: list[str] = []
    online_text = read_file(cpu_dir / "online")
    if online_text is None:
        present = sorted(int(p.name[3:]) for p in cpu_dir.glob("cpu[0-9]*") if p.name[3:].isdigit())
        if not present:
            raise CoreCPUError(
                f"no CPUs found under {cpu_dir}; pass --sysfs pointing at a tree laid out like /sys"
            )
        online = tuple(present)
    else:
        online = parse_cpu_list(online_text)

    online_set = set(online)
    # NUMA nodes: kernels without CONFIG_NUMA (and some containers) have no node dir.
    nodes: list[tuple[int, tuple[int, ...]]] = []
    for node_dir in sorted((root / "devices/system/node").glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        text = read_file(node_dir / "cpulist")
        if text is not None:
            cpus = tuple(c for c in parse_cpu_list(text, allow_empty=True) if c in online_set)
            nodes.append((int(node_dir.name[4:]), cpus))
    if not nodes or not any(cpus for _, cpus in nodes):
        notes.append("sysfs has no NUMA information; all CPUs treated as NUMA node 0")
        nodes = [(0, online)]
    node_of = {cpu: node for node, cpus in nodes for cpu in cpus}
    missing_node = [c for c in online if c not in node_of]
    if missing_node:
        notes.append(f"CPUs {format_cpu_list(missing_node)} are in no NUMA node's cpulist; placed in node {nodes[0][0]}")
        for c in missing_node:
            node_of[c] = nodes[0][0]
        nodes = [(n, tuple(sorted(c for c in online if node_of[c] == n))) for n, _ in nodes]

    # Cores: thread_siblings_list is the kernel's own statement of which CPUs
    # share a core; core_id alone repeats across packages (and across dies).
    groups: dict[tuple, list[int]] = {}
    package_of: dict[int, tuple[int, int]] = {}
    no_topology: list[int] = []
    for cpu in online:
        topo = cpu_dir / f"cpu{cpu}/topology"
        package = read_int(topo / "physical_package_id")
        core_id = read_int(topo / "core_id")
        siblings_text = read_file(topo / "thread_siblings_list")
        if package is None or core_id is None:
            no_topology.append(cpu)
            key: tuple = ("cpu", cpu)
            package, core_id = 0, cpu
        elif siblings_text and siblings_text.strip():
            key = ("siblings", tuple(c for c in parse_cpu_list(siblings_text) if c in online_set) or (cpu,))
        else:
            key = ("core", package, core_id)
        groups.setdefault(key, []).append(cpu)
        package_of[cpu] = (max(package, 0), core_id)  # VMs report package -1
    if no_topology:
        notes.append(f"no topology info for CPUs {format_cpu_list(no_topology)}; each treated as its own core")

    l3_of: dict[int, int] = {}
    l3_domains: set[tuple[int, ...]] = set()
    for cpu in online:
        for index in sorted((cpu_dir / f"cpu{cpu}/cache").glob("index[0-9]*")):
            if read_int(index / "level") == 3:
                text = read_file(index / "shared_cpu_list")
                if text:
                    shared = tuple(c for c in parse_cpu_list(text, allow_empty=True) if c in online_set)
                    if shared:
                        l3_of[cpu] = shared[0]
                        l3_domains.add(shared)

    cores: list[Core] = []
    for members in groups.values():
        first = min(members)
        package, core_id = package_of[first]
        cores.append(Core(package, core_id, node_of[first], tuple(sorted(members)), l3_of.get(first, -1)))
    # Order inside a node by L3 domain so a rank's contiguous run of cores shares a cache.
    ordered = tuple(sorted(cores, key=lambda c: (c.node, c.l3, c.package, c.core_id, c.cpus)))
    return online, ordered, tuple(nodes), tuple(sorted(l3_domains)), tuple(notes)


# ---------------------------------------------------------------- software


def default_library_dirs(env: Mapping[str, str] | None = None) -> list[str]:
    env = os.environ if env is None else env
    dirs = [os.path.join(sys.prefix, "lib")]
    for var in ("CONDA_PREFIX", "VIRTUAL_ENV"):
        if env.get(var):
            dirs.append(os.path.join(env[var], "lib"))
    dirs += ["/usr/local/lib", "/usr/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64"]
    return list(dict.fromkeys(dirs))


def find_libraries(dirs: Sequence[str | Path]) -> Libraries:
    """First match per library, searching dirs in order and patterns in preference order."""
    found: dict[str, str | None] = {}
    for name, patterns in ALLOCATOR_PATTERNS.items():
        found[name] = None
        for pattern in patterns:
            for d in dirs:
                # os.path.exists drops dangling symlinks (a -dev package's .so without the runtime).
                matches = sorted(m for m in glob.glob(os.path.join(str(d), pattern)) if os.path.exists(m))
                if matches:
                    found[name] = matches[0]
                    break
            if found[name]:
                break
    return Libraries(**found)


# ---------------------------------------------------------------- entry point


def detect_topology(
    sysfs_root: str | Path = REAL_SYSFS,
    *,
    allowed_cpus: Iterable[int] | str | None = None,
    cgroup_root: str | Path | None = AUTO,
    proc_self_cgroup: str | Path = "/proc/self/cgroup",
    proc_cpuinfo: str | Path | None = "/proc/cpuinfo",
    library_dirs: Sequence[str | Path] | None = None,
    numactl: str | None = AUTO,
    env: Mapping[str, str] | None = None,
    allowed_from_cpuset: bool = False,
) -> Topology:
    """This node's topology.

    With a fake `sysfs_root` the real process's affinity and cgroup say nothing
    about that machine, so allowed CPUs default to all its online CPUs and the
    quota to none unless `allowed_cpus` / `cgroup_root` are given. `proc_cpuinfo`
    None skips ISA detection (corecpu.cpu.hardware imports torch, which bind avoids).
    `allowed_from_cpuset` takes the cgroup cpuset instead of this process's
    affinity: a launcher may already have pinned the process narrower than the
    node's share (Open MPI binds to a core for np <= 2).
    """
    env = os.environ if env is None else env
    real = Path(sysfs_root).resolve() == Path(REAL_SYSFS).resolve()
    online, cores, nodes, l3, notes = read_sysfs(sysfs_root)
    notes = list(notes)
    if cgroup_root == AUTO:
        cgroup_root = REAL_CGROUP if real else None

    if allowed_cpus is not None:
        wanted = parse_cpu_list(allowed_cpus) if isinstance(allowed_cpus, str) else tuple(sorted(set(allowed_cpus)))
        offline = [c for c in wanted if c not in online]
        if offline:
            raise CoreCPUError(
                f"allowed CPUs {format_cpu_list(offline)} are not online on this machine "
                f"(online: {format_cpu_list(online)}); pick CPUs from the online list"
            )
        allowed = wanted
    elif real:
        cpuset = read_cpuset(cgroup_root, proc_self_cgroup) if (allowed_from_cpuset and cgroup_root) else None
        allowed = tuple(sorted(set(cpuset or os.sched_getaffinity(0)) & set(online)))
    else:
        allowed = online
    if not allowed:
        raise CoreCPUError(f"none of the allowed CPUs is online (online: {format_cpu_list(online)}); check --allowed-cpus")

    quota = read_cpu_quota(cgroup_root, proc_self_cgroup) if cgroup_root else None

    model, flags, known = "unknown CPU", (), False
    if proc_cpuinfo is not None:
        # py-cpuinfo asks this machine's CPUID, which is wrong for a fake cpuinfo file.
        is_real = Path(proc_cpuinfo).resolve() == Path("/proc/cpuinfo").resolve()
        features = read_cpu_features(proc_cpuinfo=proc_cpuinfo, use_cpuinfo_lib=is_real)
        model, known = features.model_name, True
        flags = tuple(f for f in TRACKED_FLAGS if f in features.flags)

    libs = find_libraries(default_library_dirs(env) if library_dirs is None else library_dirs)
    if numactl == AUTO:
        numactl = shutil.which("numactl", path=env.get("PATH", os.defpath))

    return Topology(
        online=online,
        cores=cores,
        nodes=nodes,
        allowed=allowed,
        cpu_quota=quota,
        model_name=model,
        isa_flags=flags,
        isa_known=known,
        libraries=libs,
        numactl=numactl,
        l3_domains=l3,
        source_notes=tuple(notes),
    )


def read_topology(**kwargs) -> Topology:
    """detect_topology without ISA flags unless asked: safe to call before torch is imported."""
    kwargs.setdefault("proc_cpuinfo", None)
    return detect_topology(**kwargs)


def add_detection_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("machine detection")
    group.add_argument("--allowed-cpus", metavar="LIST", help="CPUs to use, e.g. 0-3,8 (default: this process's affinity)")
    group.add_argument("--sysfs", metavar="ROOT", default=REAL_SYSFS,
                       help="read topology from ROOT laid out like /sys (default: /sys)")
    group.add_argument("--cgroup", metavar="ROOT", default=None,
                       help="cgroup mount to read the CPU quota from (default: /sys/fs/cgroup, none with --sysfs)")
    group.add_argument("--cpuinfo", metavar="FILE", default="/proc/cpuinfo",
                       help="cpuinfo file for the CPU model and ISA flags (default: /proc/cpuinfo)")


def topology_from_args(args: argparse.Namespace, *, read_isa: bool = True, allowed_from_cpuset: bool = False,
                       env: Mapping[str, str] | None = None) -> Topology:
    return detect_topology(
        args.sysfs,
        allowed_cpus=args.allowed_cpus,
        cgroup_root=args.cgroup if args.cgroup else AUTO,
        proc_self_cgroup=getattr(args, "proc_self_cgroup", None) or "/proc/self/cgroup",
        proc_cpuinfo=args.cpuinfo if read_isa else None,
        allowed_from_cpuset=allowed_from_cpuset,
        env=env,
    )

