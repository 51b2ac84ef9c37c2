"""Where the oneCCL bindings' source comes from, and proof that it is the source corecpu's patch was made for.

The bindings (github.com/intel/torch-ccl, BSD-3-Clause) are deprecated upstream and no registry has a
wheel for current torch, so `corecpu build-ccl` builds them from source. The source is named by a setting
($CORECPU_CCL_SOURCE or `--source`): a directory, a tarball, or a git URL@COMMIT; the default is upstream.
Whatever its form, the unpacked tree must hash to TREE_SHA256 (a tarball is also checked against
TARBALL_SHA256 before it is opened), so a copy from anywhere is trusted only if it is the pinned commit.

Torch-free; the only I/O is unpacking and `git`, both in `fetch_source`.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from corecpu import envvars
from corecpu.errors import CoreCPUError

UPSTREAM_URL = "https://github.com/intel/torch-ccl.git"
COMMIT = "1fc0c383a8665a83f274e2c863e6d1d323b02856"  # the last commit before upstream was marked deprecated
DEFAULT_SOURCE = f"{UPSTREAM_URL}@{COMMIT}"
# `git archive --prefix=torch-ccl-1fc0c38/ 1fc0c38 | gzip` (the vendored tarball's README gives the same digest).
TARBALL_SHA256 = "425b8db666e82a4b58c75adc258ed12cd4645d65e3dfb80440f1741cff259f39"
# tree_digest() of that commit's files: the same whether they came from the tarball, a clone or a directory.
TREE_SHA256 = "d91add1eb6d9599de5b075965b62d703670ad16d7721cfd621d7f714dbd580d0"
TARBALL_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".tar.xz", ".tar.bz2")
_GIT_SOURCE = re.compile(r"^(?:git\+)?(?P<url>.+)@(?P<commit>[0-9a-fA-F]{40})$")


@dataclass(frozen=True)
class Source:
    kind: str  # "dir" | "tarball" | "git"
    location: str  # the path or URL
    commit: str = ""  # for git

    def describe(self) -> str:
        return f"{self.location}@{self.commit[:7]}" if self.kind == "git" else f"{self.kind} {self.location}"


def parse_source(setting: str, exists=os.path.exists, isdir=os.path.isdir) -> Source:
    """Pure (given `exists`/`isdir`): what a source setting names. An unusable setting is an error naming the forms."""
    text = setting.strip()
    if isdir(text):
        return Source("dir", text)
    if text.endswith(TARBALL_SUFFIXES):
        if not exists(text):
            raise CoreCPUError(f"oneCCL bindings source {text} does not exist; point {envvars.CCL_SOURCE} (or --source) "
                               "at the torch-ccl tarball, a source directory, or URL@COMMIT")
        return Source("tarball", text)
    m = _GIT_SOURCE.match(text)
    if m:
        return Source("git", m["url"], m["commit"].lower())
    raise CoreCPUError(f"oneCCL bindings source {text!r} is neither a directory, a tarball ({', '.join(TARBALL_SUFFIXES)}) "
                       f"nor a git URL@COMMIT (40 hex digits); e.g. {envvars.CCL_SOURCE}={DEFAULT_SOURCE}")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tree_digest(root: Path) -> str:
    """SHA-256 over every regular file's relative path and content, in sorted order; .git and symlinks'
    targets (as text) included the same way whatever the tree came from. Empty directories do not count."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            h.update(rel.encode() + b"\0")
            if path.is_symlink():
                h.update(b"link:" + os.readlink(path).encode())
            else:
                h.update(file_sha256(path).encode())
            h.update(b"\n")
    return h.hexdigest()


def _single_top(root: Path) -> Path:
    """An archive's tree usually sits in one top directory (torch-ccl-1fc0c38/); use it."""
    entries = list(root.iterdir())
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else root


def fetch_source(source: Source, dest: Path, expect_tree: str = TREE_SHA256) -> tuple[Path, str]:
    """Copy, unpack or clone `source` under `dest` (which must not exist); verify it. (tree, tree digest)."""
    dest.mkdir(parents=True)
    if source.kind == "tarball":
        got = file_sha256(Path(source.location))
        if got != TARBALL_SHA256:
            raise CoreCPUError(f"{source.location} has SHA-256 {got}, not the pinned {TARBALL_SHA256} of torch-ccl "
                               f"{COMMIT[:7]}; use the tarball from shared/vendor/ or {envvars.CCL_SOURCE}={DEFAULT_SOURCE}")
        with tarfile.open(source.location) as tar:
            try:
                tar.extractall(dest / "src", filter="data")
            except TypeError:  # Python < 3.11.4 (Debian 12's 3.11.2) has no filter; the digest was checked above
                tar.extractall(dest / "src")
        tree = _single_top(dest / "src")
    elif source.kind == "dir":
        tree = dest / "src"
        shutil.copytree(source.location, tree, symlinks=True, ignore=shutil.ignore_patterns(".git", "build"))
    else:
        tree = dest / "src"
        try:
            # No submodules: the bindings build against PyPI's oneCCL, not upstream's third_party/oneCCL.
            subprocess.run(["git", "clone", "--quiet", "--no-checkout", "--filter=blob:none", source.location, str(tree)],
                           check=True, capture_output=True, text=True)
            subprocess.run(["git", "-C", str(tree), "checkout", "--quiet", source.commit],
                           check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            detail = getattr(exc, "stderr", "") or str(exc)
            raise CoreCPUError(f"could not fetch {source.describe()} ({detail.strip().splitlines()[-1] if detail.strip() else exc}); "
                               f"offline, point {envvars.CCL_SOURCE} at the vendored tarball") from None
        shutil.rmtree(tree / ".git")
    digest = tree_digest(tree)
    if expect_tree and digest != expect_tree:
        raise CoreCPUError(f"the oneCCL bindings source from {source.describe()} hashes to {digest}, not the pinned "
                           f"{expect_tree} (torch-ccl {COMMIT[:7]}); corecpu's patch is made for that commit only")
    return tree, digest
