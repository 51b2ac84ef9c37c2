"""Which malloc the ranks run on: the one the plan preloads, and the one a rank finds in force.

tcmalloc keeps freed memory for reuse; glibc's malloc hands large blocks back and takes them again, so a batch
longer than the last ones pays page faults. With tcmalloc MiniLM's 2-rank job trained 1.06-1.16x as fast on the AMX
Xeon; on a 2-vCPU Zen 5 EPYC, 1.06-1.12x in seven back-to-back pairs but 0.99x between two benchmark runs (medians of
three, benchmarks/README.md); jemalloc was no faster than glibc's there and 0.70x on ResNet-50. So `auto` preloads
tcmalloc where it is installed, and a rank that runs on glibc's malloc says how to get it.
"""

from __future__ import annotations

import os
from typing import Callable, Mapping

from corecpu import envvars
from corecpu.cpu.topology import Libraries
from corecpu.errors import CoreCPUError

ALLOCATORS = ("auto", "tcmalloc", "jemalloc", "system")
TCMALLOC_PACKAGE = "libtcmalloc-minimal4"  # Debian's and Ubuntu's name (gperftools-libs on RHEL)


def chosen_allocator(asked: str, libs: Libraries) -> str | None:
    """The allocator library to preload: `auto` tcmalloc where it is installed, `system` none (glibc's malloc),
    a name that library, which must be installed. auto leaves jemalloc to be asked for (above)."""
    if asked not in ALLOCATORS:
        raise CoreCPUError(f"{envvars.ALLOCATOR}={asked!r} is not one of {', '.join(ALLOCATORS)}")
    if asked == "system":
        return None
    if asked == "auto":
        return libs.tcmalloc
    found = libs.tcmalloc if asked == "tcmalloc" else libs.jemalloc
    if found is None:
        package = TCMALLOC_PACKAGE if asked == "tcmalloc" else "libjemalloc2"
        raise CoreCPUError(f"{envvars.ALLOCATOR}={asked} but no lib{asked} was found; install {package} (apt) or "
                           f"unset {envvars.ALLOCATOR}")
    return found


def in_use(env: Mapping[str, str]) -> str:
    """What this process's LD_PRELOAD makes malloc: tcmalloc, jemalloc, or glibc (nothing preloaded)."""
    for lib in env.get("LD_PRELOAD", "").replace(":", " ").split():
        name = os.path.basename(lib)
        for allocator in ("tcmalloc", "jemalloc"):
            if name.startswith(f"lib{allocator}"):
                return allocator
    return "glibc"


def describe(env: Mapping[str, str], libraries: Callable[[], Libraries]) -> str:
    """For the start-up banner: the malloc in force (`env`'s LD_PRELOAD) and, when `auto` left glibc's, why: no
    tcmalloc among `libraries()` (asked only then), with how to install it; or a launcher that did not preload it."""
    name = in_use(env)
    if name != "glibc" or env.get(envvars.ALLOCATOR, "auto") != "auto":
        return name
    tcmalloc = libraries().tcmalloc
    if tcmalloc:
        return (f"glibc ({tcmalloc} is installed, but the launcher started this rank without it: "
                "./launch.sh and corecpu launch preload it)")
    return (f"glibc (no tcmalloc found: `apt-get install {TCMALLOC_PACKAGE}` and corecpu preloads it; "
            "what it gained is in benchmarks/README.md)")


__all__ = ["ALLOCATORS", "TCMALLOC_PACKAGE", "chosen_allocator", "describe", "in_use"]
