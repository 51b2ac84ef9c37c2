"""The malloc a rank runs on, as the start-up banner says it (corecpu.cpu.allocator)."""

from __future__ import annotations

import pytest

from corecpu import envvars
from corecpu.cpu.allocator import TCMALLOC_PACKAGE, chosen_allocator, describe, in_use
from corecpu.cpu.topology import Libraries
from corecpu.errors import CoreCPUError

TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
IOMP = "/opt/venv/lib/libiomp5.so"


@pytest.mark.parametrize("preload, expected", [
    ("", "glibc"),
    (IOMP, "glibc"),
    (f"{TCMALLOC}:{IOMP}", "tcmalloc"),
    (f"{IOMP} {JEMALLOC}", "jemalloc"),  # ld.so takes spaces as well as colons
    ("/opt/libtcmalloc_not_really/libfoo.so", "glibc"),  # the library's own name decides, not its folder
])
def test_in_use_reads_the_preloaded_library_names(preload: str, expected: str) -> None:
    assert in_use({"LD_PRELOAD": preload}) == expected


def _never() -> Libraries:
    raise AssertionError("the installed libraries were looked up although nothing needed them")


def test_a_preloaded_allocator_is_named_without_looking_for_libraries() -> None:
    assert describe({"LD_PRELOAD": TCMALLOC}, _never) == "tcmalloc"
    assert describe({"LD_PRELOAD": JEMALLOC, envvars.ALLOCATOR: "jemalloc"}, _never) == "jemalloc"


def test_glibc_asked_for_is_just_glibc() -> None:
    assert describe({envvars.ALLOCATOR: "system"}, _never) == "glibc"


def test_glibc_under_auto_without_tcmalloc_says_how_to_install_it() -> None:
    text = describe({}, lambda: Libraries(jemalloc=JEMALLOC))
    assert text.startswith("glibc (no tcmalloc found")
    assert f"apt-get install {TCMALLOC_PACKAGE}" in text


def test_glibc_under_auto_with_tcmalloc_installed_blames_the_launcher_not_the_machine() -> None:
    text = describe({}, lambda: Libraries(tcmalloc=TCMALLOC))
    assert TCMALLOC in text and "launch.sh" in text and "apt-get" not in text


def test_chosen_allocator_prefers_tcmalloc_and_refuses_a_missing_one() -> None:
    libs = Libraries(tcmalloc=TCMALLOC, jemalloc=JEMALLOC)
    assert chosen_allocator("auto", libs) == TCMALLOC
    assert chosen_allocator("jemalloc", libs) == JEMALLOC
    assert chosen_allocator("system", libs) is None
    assert chosen_allocator("auto", Libraries()) is None
    with pytest.raises(CoreCPUError, match=f"install {TCMALLOC_PACKAGE}"):
        chosen_allocator("tcmalloc", Libraries())
    with pytest.raises(CoreCPUError, match="not one of"):
        chosen_allocator("mimalloc", libs)
