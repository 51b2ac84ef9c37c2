"""Which MPI the `mpirun` found is, and the command that starts N ranks through it.

Two families start ranks differently:

- hydra (Intel MPI, which the `mpi` extra installs, and MPICH): `-f HOSTFILE -ppn N`, the whole environment
  propagated to every host, `I_MPI_PIN=0` so that corecpu.bind pins;
- Open MPI (what many clusters and images preinstall): `--host a:N,b:N --map-by ppr:N:node`, only the `-x`
  variables reach other hosts, `--bind-to none` (it binds each rank to a core for np <= 2 otherwise), and it
  refuses to run as root unless told. A stop signal goes to the ranks themselves, not through it
  (corecpu.launching.launch): it would pass SIGINT on as SIGTERM, SIGKILL the ranks a second later
  (`odls_base_sigkill_timeout`, whose every larger value made each exit of a stopped job wait twice as long:
  61 s at 30) and exit 1 whatever the ranks saved.

mpi4py's wheels carry both ABIs and load the first libmpi they find, which is impi-rt's in an environment the
`mpi` extra made. Under Open MPI's mpirun that MPI would start a world of one in each rank, so the launcher
points mpi4py at Open MPI's own library (MPI4PY_LIBMPI), unless the user already chose one.

`detect` runs `mpirun --version` (20 ms) and, for Open MPI, `ompi_info`; the rest is pure.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

HYDRA, OPEN_MPI = "hydra", "openmpi"
OPEN_MPI_SONAME = "libmpi.so.40"  # the ABI of Open MPI 3 to 5
# Variables that a rank on another host needs from the launcher's: Open MPI passes only the ones named with -x.
FORWARD_ALWAYS = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "HOME")
FORWARD_PREFIXES = ("CORECPU_", "OMP_", "KMP_", "MALLOC_", "MPI4PY_", "CCL_", "HF_", "TRANSFORMERS_", "TORCH")


@dataclass(frozen=True)
class MpiKind:
    family: str  # HYDRA or OPEN_MPI
    label: str  # what runs, in people's words: "Intel MPI 2021.18.1", "Open MPI 4.1.4", "MPICH 4.0"
    libmpi: str | None = None  # Open MPI's libmpi, for mpi4py; None for hydra's MPIs


def parse_version(text: str) -> tuple[str, str]:
    """(family, label) from `mpirun --version`'s output. Anything not recognised is taken for hydra, the
    family corecpu's own `mpi` extra installs, and labelled by its first line."""
    if m := re.search(r"\(Open MPI\)\s+(\S+)", text):
        return OPEN_MPI, f"Open MPI {m.group(1)}"
    if m := re.search(r"Intel\(R\) MPI Library.*?Version\s+(\S+)", text):
        return HYDRA, f"Intel MPI {m.group(1)}"
    if "HYDRA build details" in text:
        m = re.search(r"Version:\s+(\S+)", text)
        return HYDRA, f"MPICH {m.group(1)}" if m else "MPICH"
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return HYDRA, first[:60] or "an unknown MPI"


def detect(mpirun: str, run: Callable[[Sequence[str]], str] | None = None) -> MpiKind:
    """The MPI behind `mpirun` (a path). `run(argv) -> output` replaces the subprocess in tests."""
    run = run or _output
    family, label = parse_version(run([mpirun, "--version"]))
    if family != OPEN_MPI:
        return MpiKind(family, label)
    return MpiKind(family, label, open_mpi_libmpi(run([str(Path(mpirun).parent / "ompi_info"), "--path", "libdir",
                                                        "--parsable"])))


def open_mpi_libmpi(ompi_info: str, exists: Callable[[str], bool] = os.path.isfile) -> str:
    """Open MPI's libmpi from `ompi_info --path libdir --parsable` ("path:libdir:/usr/lib/.../openmpi/lib"). Debian
    keeps only its plugins there and the library two levels up. Where neither has it, or ompi_info is missing or
    said nothing: the bare soname, which the dynamic linker finds on its own path (LD_LIBRARY_PATH, as
    `module load openmpi` sets it)."""
    m = re.search(r"path:libdir:(\S+)", ompi_info)
    if not m:
        return OPEN_MPI_SONAME
    libdir = m.group(1).rstrip("/")
    for folder in (libdir, os.path.dirname(libdir), os.path.dirname(os.path.dirname(libdir))):
        if exists(path := os.path.join(folder, OPEN_MPI_SONAME)):
            return path
    return OPEN_MPI_SONAME


def _output(argv: Sequence[str]) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout + done.stderr


def mpi4py_has_both_abis(find_spec=None) -> bool:
    """Whether this environment's mpi4py is a wheel that picks its MPI at import (MPI.openmpi*.so beside
    MPI.mpich*.so), so MPI4PY_LIBMPI can point it at Open MPI; a build against one MPI has a single MPI*.so."""
    import importlib.util

    spec = (find_spec or importlib.util.find_spec)("mpi4py")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(Path(d).glob("MPI.openmpi*.so") for d in spec.submodule_search_locations)


def command(kind: MpiKind, nranks: int, ppn: int, hostfile: str | None, hosts: Sequence[str], *,
            oversubscribe: bool, as_root: bool, forward: Sequence[str] = ()
            ) -> tuple[list[str], dict[str, str], list[str]]:
    """Pure: (mpirun and its options, variables to set, notes to print) that start `nranks` ranks, `ppn` on each
    host of `hostfile` (`hosts`: its host names) or all on this host (None). The rank's own command follows.
    `forward`: the names Open MPI must pass to other hosts (hydra passes the whole environment)."""
    if kind.family != OPEN_MPI:
        cmd = ["mpirun", "-n", str(nranks)]
        if hostfile:
            cmd += ["-f", hostfile, "-ppn", str(ppn)]
        return cmd, {"I_MPI_PIN": "0"}, []  # corecpu.bind pins each rank from its own node's plan
    cmd = ["mpirun", "-n", str(nranks), "--bind-to", "none"]
    notes = []
    if as_root:
        cmd.append("--allow-run-as-root")
        notes.append(f"running as root: passing {kind.label} --allow-run-as-root (it refuses root without it)")
    if oversubscribe:
        cmd.append("--oversubscribe")
    if hostfile:
        # Open MPI reads "host slots=N" files, not hydra's "host:N": the hosts go on the command line instead.
        cmd += ["--host", ",".join(f"{h}:{ppn}" for h in dict.fromkeys(hosts)), "--map-by", f"ppr:{ppn}:node"]
        for name in forward:
            cmd += ["-x", name]
    return cmd, {}, notes


def forwarded_names(environ: Mapping[str, str], launch_env: Mapping[str, str]) -> list[str]:
    """Pure: the variables a rank on another host needs, for Open MPI's -x: what the launch sets, the paths that
    find Python and its packages, and the settings corecpu, OpenMP, the allocator and the libraries read."""
    names = dict.fromkeys(launch_env)
    for name in environ:
        if name in FORWARD_ALWAYS or name.startswith(FORWARD_PREFIXES):
            names.setdefault(name)
    return sorted(names)


def mpi4py_library(kind: MpiKind, environ: Mapping[str, str], both_abis: bool) -> dict[str, str]:
    """Pure: MPI4PY_LIBMPI for the ranks where mpi4py would otherwise load another MPI than the one starting them."""
    if kind.family != OPEN_MPI or not kind.libmpi or not both_abis:
        return {}
    if "MPI4PY_LIBMPI" in environ or "MPI4PY_MPIABI" in environ:
        return {}  # the user's choice
    return {"MPI4PY_LIBMPI": kind.libmpi}


__all__ = ["HYDRA", "OPEN_MPI", "MpiKind", "command", "detect", "forwarded_names", "mpi4py_has_both_abis",
           "mpi4py_library", "open_mpi_libmpi", "parse_version"]
