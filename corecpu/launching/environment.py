"""`corecpu env`: what this machine and Python environment are, ready to paste into a bug report
(as `accelerate env` and `python -m torch.utils.collect_env` do).

Torch-free: versions come from package metadata, nothing is imported, so it works where torch
itself is broken. The CPU, cgroup and plan facts are the same functions `corecpu plan` and the
ranks use, so the report shows what a run would see.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
from typing import Mapping

from corecpu import envvars
from corecpu.cluster.launchers import detect_launcher
from corecpu.cpu.cgroups import REAL_CGROUP, read_cpu_quota, read_cpuset, read_memory_limit
from corecpu.cpu.cpulist import format_cpu_list
from corecpu.cpu.hardware import CCL, installed_extension, installed_version, read_cpu_features
from corecpu.cpu.placement import Plan
from corecpu.errors import CoreCPUError

IPEX = ("intel_extension_for_pytorch", ("intel_extension_for_pytorch", "intel-extension-for-pytorch"))
# (what to call it, its distribution names on PyPI, in the order tried)
PACKAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("corecpu", ("corecpu",)),
    ("torch", ("torch",)),
    ("transformers", ("transformers",)),
    ("impi-rt", ("impi-rt", "impi_rt")),
    ("mpi4py", ("mpi4py",)),
    ("oneccl_bindings_for_pytorch", CCL[1]),
    IPEX,
    ("deepspeed", ("deepspeed",)),
    ("numpy", ("numpy",)),
    ("datasets", ("datasets",)),
)
EXTENSIONS = (CCL, IPEX)  # built for one torch minor release
COMMANDS = ("mpirun", "torchrun", "srun", "ipexrun", "numactl")
# The variables that decide where a rank goes and how it runs, worth seeing in a report.
VARIABLES = ("OMP_NUM_THREADS", "KMP_AFFINITY", "MASTER_ADDR", "MASTER_PORT", "I_MPI_PIN", "I_MPI_PIN_DOMAIN",
             "CCL_WORKER_COUNT", "LD_PRELOAD", "SLURM_JOB_ID", "SLURM_CPUS_PER_TASK", "SLURM_NTASKS",
             envvars.CACHE_DIR, "HF_HOME")


def package_versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {name: installed_version(dists) for name, dists in PACKAGES}
    # An extension built for another torch minor release is installed but unusable: say so beside it.
    for module, dists in EXTENSIONS:
        problem = installed_extension(module, dists)
        if found[module] is not None and problem is not None:
            found[module] = f"{found[module]} ({problem.reason})"
    return found


def launcher(env: Mapping[str, str]) -> dict:
    try:
        info = detect_launcher(env)
    except CoreCPUError as exc:  # the variables contradict each other: that is the report
        return {"detected": None, "error": str(exc)}
    return {"detected": info.launcher, "rank": info.rank, "world_size": info.world_size,
            "local_rank": info.local_rank, "local_world_size": info.local_world_size}


def find_command(name: str, env: Mapping[str, str]) -> str | None:
    """On PATH, or beside this Python: launch.sh puts the environment's bin (impi-rt's mpirun) on PATH."""
    return shutil.which(name, path=env.get("PATH")) or shutil.which(name, path=os.path.dirname(sys.executable))


def cgroup_limits(cgroup_root: str, proc_self_cgroup: str) -> dict:
    cpuset = read_cpuset(cgroup_root, proc_self_cgroup)
    return {"cpu_quota": read_cpu_quota(cgroup_root, proc_self_cgroup),
            "cpuset": format_cpu_list(cpuset) if cpuset is not None else None,
            "memory_bytes": read_memory_limit(cgroup_root, proc_self_cgroup)}


def collect(plan: Plan | None, plan_error: str | None, *, env: Mapping[str, str] | None = None,
            cgroup_root: str = REAL_CGROUP, proc_self_cgroup: str = "/proc/self/cgroup",
            cpuinfo: str = "/proc/cpuinfo") -> dict:
    """The whole report as plain data (what --json prints); `plan` is None when planning failed with `plan_error`."""
    env = os.environ if env is None else env
    cpu = read_cpu_features(cpuinfo, use_cpuinfo_lib=cpuinfo == "/proc/cpuinfo")  # CPUID describes this CPU only
    return {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "packages": package_versions(),
        "cpu": {"model": cpu.model_name, "flags": sorted(cpu.flags), "tracked": cpu.tracked()},
        "launcher": launcher(env),
        "commands": {name: find_command(name, env) for name in COMMANDS},
        "cgroup": cgroup_limits(cgroup_root, proc_self_cgroup),
        "variables": {k: env[k] for k in VARIABLES if k in env},
        "plan": plan.to_json() if plan is not None else {"error": plan_error},
    }


def render_text(report: dict) -> str:
    """Plain `key: value` lines, short enough for an issue; all CPU flags only in --json."""
    def fmt(v: object) -> str:
        return "not installed" if v is None else str(v)

    lines = ["corecpu env", f"- python: {report['python']} ({report['executable']})",
             f"- platform: {report['platform']}"]
    lines += [f"- {name}: {fmt(v)}" for name, v in report["packages"].items()]
    cpu = report["cpu"]
    lines.append(f"- CPU: {cpu['model']}")
    lines.append("- CPU flags: " + " ".join(f"{f}{'+' if on else '-'}" for f, on in cpu["tracked"].items()))
    la = report["launcher"]
    lines.append(f"- launcher: {la['error'] if la['detected'] is None else la['detected']}"
                 + (f" (rank {la['rank']} of {la['world_size']})" if la.get("detected") else ""))
    lines.append("- commands: " + ", ".join(f"{k} {'not found' if v is None else v}" for k, v in report["commands"].items()))
    cg = report["cgroup"]
    memory = "none" if cg["memory_bytes"] is None else f"{cg['memory_bytes'] / 2**30:.1f} GiB"
    lines.append(f"- cgroup: CPU quota {cg['cpu_quota'] or 'none'}, cpuset {cg['cpuset'] or 'not read'}, memory {memory}")
    lines += [f"- ${k}={v}" for k, v in report["variables"].items()]
    plan = report["plan"]
    if "error" in plan:
        lines.append(f"- plan: {plan['error']}")
    else:
        m = plan["machine"]
        lines.append(f"- machine: {m['sockets']} socket(s), {m['cores']} core(s), {m['threads']} thread(s), "
                     f"allowed CPUs {m['allowed_cpus']}")
        lines += [f"- plan rank {r['rank']}: CPUs {r['cpus']}, {r['omp_num_threads']} thread(s), NUMA {r['numa_node']}"
                  for r in plan["ranks"]]
        lines += [f"- plan warning: {w}" for w in plan["warnings"]]
    return "\n".join(lines) + "\n"
