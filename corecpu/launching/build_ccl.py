"""`corecpu build-ccl`: the oneCCL bindings (`init_process_group("ccl")`) for the torch in this environment.

Intel stopped publishing oneccl_bind_pt wheels at torch 2.8. This builds the last upstream source against the
installed torch and PyPI's oneCCL, with corecpu's small patch (patches/torch-ccl-1fc0c38.patch), caches the
wheel under the corecpu cache keyed by torch, oneCCL, source, patch and Python, and installs it. Steps:

1. source: fetched and verified (ccl_source.py); skipped on a cache hit.
2. oneCCL for the build: `oneccl-cpu` + `oneccl-cpu-devel` (headers) into a scratch prefix, so the
   environment never carries the 220 MB static library.
3. the wheel: `pip wheel --no-build-isolation` with USE_SYSTEM_ONECCL=1, CCL_ROOT=<prefix>, MAX_JOBS; for a
   CUDA build of torch (PyPI's 2.8, which IPEX needs), against a CPU-only view of its CMake package
   (torch_cmake_view.py).
4. install: `oneccl-cpu` with --no-deps (it declares libfabric>=2.6, which PyPI lacks; impi-rt's 2.4
   works), Intel's genuine libccl.so.2 copied from the full `oneccl` wheel (the oneccl-cpu wheels link
   it but do not ship it; Intel's licence forbids a stand-in), then the bindings. Anything that fails
   before this step leaves the environment untouched; a failure within it is rolled back.

Torch-free: torch's version is read from package metadata, and everything that imports torch runs as a
subprocess of the environment's python.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from corecpu import atomic, envvars
from corecpu.errors import CoreCPUError
from corecpu.launching.ccl_source import COMMIT, DEFAULT_SOURCE, TREE_SHA256, Source, fetch_source, parse_source
from corecpu.launching.torch_cmake_view import make_view, torch_dir, view_env

# PyPI's newest. The bindings' C++ compiles against it unchanged, and its only wrinkle (libccl.so.2, copied
# from the full wheel) is one file, so the older 2021.17 series was not built for comparison.
ONECCL = "2022.2.0"
PATCH = Path(__file__).with_name("patches") / f"torch-ccl-{COMMIT[:7]}.patch"
DIST_NAME = "oneccl_bind_pt"  # what setup.py calls the wheel (CCL_PACKAGE_NAME), as Intel published it
MIN_TORCH = (2, 8)
BUILD_SETUPTOOLS = "setuptools>=70.1"


@dataclass(frozen=True)
class Target:
    """The environment a wheel is built for (all read once, by `target_of`)."""

    python: str  # its interpreter
    prefix: Path  # sys.prefix: oneCCL's libraries go to prefix/lib, beside impi-rt's libfabric
    torch: str  # "2.13.0+cpu"
    py_tag: str  # "cp311"

    @property
    def torch_release(self) -> str:
        return self.torch.split("+")[0]


@dataclass
class Report:
    """What build-ccl did, step by step, with how long each took."""

    steps: list[tuple[str, float]] = field(default_factory=list)

    def timed(self, what: str, fn: Callable[[], object]) -> object:
        t0 = time.monotonic()
        out = fn()
        self.steps.append((what, time.monotonic() - t0))
        print(f"build-ccl: {what} ({time.monotonic() - t0:.1f} s)", flush=True)
        return out


def patch_digest(path: Path = PATCH) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cache_key(target: Target, oneccl: str = ONECCL, tree: str = TREE_SHA256, patch: str = "") -> str:
    """Pure: one directory per (torch, oneCCL, source, patch, Python); a change in any needs a new build."""
    return f"torch{target.torch}-oneccl{oneccl}-src{tree[:12]}-patch{patch[:8]}-{target.py_tag}"


def wheel_version(torch_version: str) -> str:
    """Pure: the bindings' version, for corecpu.cpu.hardware's check that they match torch's minor release."""
    return f"{torch_version.split('+')[0]}+corecpu.{COMMIT[:7]}"


def check_torch(torch_version: str | None, python: str) -> None:
    if torch_version is None:
        raise CoreCPUError(f"no torch in the environment of {python}; install corecpu first (./launch.sh --setup-only) "
                           "or activate the environment the bindings are for")
    major_minor = tuple(int(p) for p in torch_version.split("+")[0].split(".")[:2])
    if major_minor < MIN_TORCH:
        raise CoreCPUError(f"torch {torch_version} is older than the bindings' source supports (2.8); "
                           "upgrade torch (pip install -c constraints.txt torch) and run build-ccl again")


def target_of(python: str = sys.executable) -> Target:
    """The environment build-ccl serves: this interpreter's (a venv's `corecpu` runs in it)."""
    try:
        torch_version: str | None = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = None
    check_torch(torch_version, python)
    return Target(python, Path(sys.prefix), torch_version or "", f"cp{sys.version_info[0]}{sys.version_info[1]}")


def _pip(target: Target, *args: str, log: Path | None = None) -> None:
    cmd = [target.python, "-m", "pip", *args, "--disable-pip-version-check", "-q"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if log is not None:
        log.write_text(out.stdout + out.stderr)
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["(no output)"]
        where = f" (log: {log})" if log is not None else ""
        raise CoreCPUError(f"pip {' '.join(args[:2])} failed: {tail[0]}{where}; check the package index is reachable "
                           "(offline: PIP_FIND_LINKS=<dir with the oneccl wheels>)")


def libccl2(target: Target, cache: Path) -> Path:
    """Intel's libccl.so.2 from the full `oneccl` wheel (92 MB, downloaded once), kept in the cache."""
    kept = cache / f"oneccl-{ONECCL}" / "libccl.so.2"
    if kept.exists():
        return kept
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        _pip(target, "download", "--no-deps", "-d", tmp, f"oneccl=={ONECCL}")
        (wheel,) = Path(tmp).glob("oneccl-*.whl")
        with zipfile.ZipFile(wheel) as zf:
            data = zf.read(f"oneccl-{ONECCL}.data/data/lib/libccl.so.2")
        kept.parent.mkdir(parents=True, exist_ok=True)
        with atomic.replacing(kept) as part:
            part.write_bytes(data)
            part.chmod(0o755)
    return kept


def build_env(base: Mapping[str, str], ccl_root: Path, jobs: int) -> dict[str, str]:
    """Pure: the environment setup.py builds in."""
    env = {k: v for k, v in base.items() if k not in ("COMPUTE_BACKEND", "CCL_CONFIGURATION_PATH")}
    env.update(USE_SYSTEM_ONECCL="1", CCL_ROOT=str(ccl_root), MAX_JOBS=str(jobs), CCL_PACKAGE_NAME=DIST_NAME)
    return env


def build_wheel(target: Target, source: Source, work: Path, jobs: int, report: Report) -> Path:
    """Fetch, verify, patch and build in `work`; the wheel's path. Touches nothing outside `work`."""
    tree, _ = report.timed(f"source {source.describe()} verified", lambda: fetch_source(source, work / "source"))
    applied = subprocess.run(["patch", "-p1", "--forward", "--batch", "-i", str(PATCH)], cwd=tree,
                             capture_output=True, text=True)
    if applied.returncode != 0:
        raise CoreCPUError(f"corecpu's patch does not apply to {source.describe()}: {applied.stdout.strip()[-200:]}")
    (tree / "version.txt").write_text(wheel_version(target.torch) + "\n")
    prefix = work / "oneccl"  # --ignore-installed: the environment may have oneccl-cpu already (a rebuild)
    report.timed(f"oneccl-cpu {ONECCL} + headers for the build",
                 lambda: _pip(target, "install", "--no-deps", "--ignore-installed", "--prefix", str(prefix),
                              f"oneccl-cpu=={ONECCL}", f"oneccl-cpu-devel=={ONECCL}"))
    so2 = report.timed("Intel's libccl.so.2 from the oneccl wheel", lambda: libccl2(target, work.parent))
    shutil.copy2(so2, prefix / "lib" / "libccl.so.2")  # type: ignore[arg-type]
    # --no-build-isolation builds with the environment's own setuptools, and a venv made by Python 3.11-3.12's
    # ensurepip has 65.5, which lacks bdist_wheel (built in since 70.1). A newer one goes on the build's path
    # only, so the environment is left as it was.
    tools = work / "build-tools"
    report.timed(f"{BUILD_SETUPTOOLS} for the build (outside the environment)",
                 lambda: _pip(target, "install", "--no-deps", "--target", str(tools), BUILD_SETUPTOOLS))
    log = work / "build.log"
    dist = work / "dist"
    env = build_env(os.environ, prefix, jobs)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tools), env.get("PYTHONPATH", "")) if p)
    # PyPI's torch 2.8 (the one IPEX 2.8 needs) is a CUDA build whose CMake package demands the CUDA toolkit.
    view = make_view(torch_dir(), work / "torch-cmake-view")
    if view is not None:
        report.steps.append((f"CPU-only view of torch {target.torch}'s CMake package (a CUDA build) in {view}", 0.0))
        print(f"build-ccl: {report.steps[-1][0]}", flush=True)
        env.update(view_env(view))

    def build() -> None:
        with open(log, "w") as out:
            done = subprocess.run([target.python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
                                   "--disable-pip-version-check", "-w", str(dist), str(tree)],
                                  cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            tail = log.read_text().strip().splitlines()[-3:]
            raise CoreCPUError(f"building the bindings failed ({' | '.join(tail)}); the full log is {log}")

    report.timed(f"bindings compiled against torch {target.torch} with MAX_JOBS={jobs}", build)
    (wheel,) = dist.glob(f"{DIST_NAME}-*.whl")
    return wheel


def install(target: Target, wheel: Path, cache: Path, report: Report) -> None:
    """oneCCL's runtime, libccl.so.2 and the bindings into the environment; rolled back if any step fails."""
    so2 = target.prefix / "lib" / "libccl.so.2"
    had_so2 = so2.exists()
    genuine = libccl2(target, cache)
    try:
        report.timed(f"oneccl-cpu {ONECCL} installed (--no-deps)",
                     lambda: _pip(target, "install", "--no-deps", f"oneccl-cpu=={ONECCL}"))
        shutil.copy2(genuine, so2)
        report.timed(f"{wheel.name} installed",
                     lambda: _pip(target, "install", "--no-deps", "--force-reinstall", str(wheel)))
        check = subprocess.run([target.python, "-c", "import oneccl_bindings_for_pytorch as b; print(b.__version__)"],
                               capture_output=True, text=True, cwd=tempfile.gettempdir())
        if check.returncode != 0:
            raise CoreCPUError("the installed bindings do not import: "
                               f"{(check.stderr.strip().splitlines() or ['?'])[-1]}")
    except BaseException:
        subprocess.run([target.python, "-m", "pip", "uninstall", "-y", "-q", DIST_NAME, "oneccl-cpu"],
                       capture_output=True)
        if not had_so2:
            so2.unlink(missing_ok=True)
        raise


def build_ccl(setting: str | None = None, jobs: int | None = None, rebuild: bool = False,
              env: Mapping[str, str] = os.environ, install_wheel: bool = True) -> Report:
    """Build (or take from the cache) and install the bindings for this environment's torch; with
    `install_wheel` False, only make sure the cached wheel exists."""
    report = Report()
    target = target_of()
    source = parse_source(setting or env.get(envvars.CCL_SOURCE) or DEFAULT_SOURCE)  # a bad setting fails even on a cache hit
    jobs = jobs or int(env.get("MAX_JOBS") or 1)
    cache = envvars.cache_dir(env) / "ccl"
    cache.mkdir(parents=True, exist_ok=True)
    kept = cache / cache_key(target, patch=patch_digest())
    cached = sorted(kept.glob(f"{DIST_NAME}-*.whl"))
    if cached and not rebuild:
        wheel = cached[0]
        print(f"build-ccl: cached wheel {wheel} (torch {target.torch}, oneCCL {ONECCL}); no build needed", flush=True)
    else:
        work = Path(tempfile.mkdtemp(prefix="build-", dir=cache))
        built = build_wheel(target, source, work, jobs, report)  # on failure `work` stays: the error names its log
        kept.mkdir(exist_ok=True)
        with atomic.replacing(kept / built.name) as part:
            shutil.copy2(built, part)
        wheel = kept / built.name
        shutil.rmtree(work, ignore_errors=True)
    if not install_wheel:
        print(f"build-ccl: wheel cached at {wheel}; not installed (--wheel-only)", flush=True)
        return report
    install(target, wheel, cache, report)
    total = sum(s for _, s in report.steps)
    print(f"build-ccl: oneccl_bindings_for_pytorch {wheel_version(target.torch)} ready in {target.prefix} "
          f"for torch {target.torch} ({total:.0f} s in all); use it with --backend ccl (auto picks it)", flush=True)
    return report
