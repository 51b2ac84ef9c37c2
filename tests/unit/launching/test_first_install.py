"""Issue 27: where launch.sh's first install takes torch from. PyPI's Linux torch is the CUDA build; by default
the first run adds PyTorch's CPU index (torch pinned, so 2.13.0+cpu wins), and it leaves pip alone when the user
chose: their own index, an environment with torch, or CORECPU_TORCH_INDEX (a URL, a wheel directory, or empty).

The decision is pure (torch_source); one test runs the real pip against fake local indexes (PEP 503 directories
behind file:// URLs, holding tiny 'torch' wheels whose local label says which index they came from)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from corecpu.launching.install import CPU_INDEX, torch_source
from helpers.common import ROOT

C = str(ROOT / "constraints.txt")


@pytest.mark.parametrize("env, has_torch, config, words", [
    ({}, False, "", ["-c", C, "--extra-index-url", CPU_INDEX]),  # a newcomer: the CPU build
    ({}, True, "", []),  # an activated env with torch keeps it, unpinned
    ({"CORECPU_TORCH_INDEX": ""}, False, "", ["-c", C]),  # turned off
    ({"CORECPU_TORCH_INDEX": "https://mirror/cpu"}, False, "", ["-c", C, "--extra-index-url", "https://mirror/cpu"]),
    ({"CORECPU_TORCH_INDEX": "/wheels"}, False, "", ["-c", C, "--find-links", "/wheels"]),  # offline, a directory
    ({"PIP_INDEX_URL": "https://mirror/simple"}, False, "", ["-c", C]),  # the user's own index
    ({"PIP_EXTRA_INDEX_URL": "https://x"}, False, "", ["-c", C]),
    ({"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/w"}, False, "", ["-c", C]),
    ({}, False, "global.index-url='https://mirror/simple'\n", ["-c", C]),  # ... in pip.conf
    ({}, False, "global.constraint='/etc/xdg/pip/constraints.txt'\n", ["-c", C, "--extra-index-url", CPU_INDEX]),
    ({"PIP_INDEX_URL": "https://m", "CORECPU_TORCH_INDEX": "https://c"}, False, "",
     ["-c", C, "--extra-index-url", "https://c"]),  # asked for explicitly: added to the user's index
])
def test_torch_source(env, has_torch, config, words):
    how, got = torch_source(env, has_torch, config, C, is_dir=lambda p: p == "/wheels")
    assert got == words and "\n" not in how
    if words[-1:] == [CPU_INDEX]:
        assert "CPU build" in how and "CORECPU_TORCH_INDEX= to turn" in how


def fake_wheel(directory: Path, version: str) -> Path:
    name = f"torch-{version}-py3-none-any.whl"
    info = f"torch-{version}.dist-info"
    with zipfile.ZipFile(directory / name, "w") as z:
        z.writestr("torch/__init__.py", f"__version__ = {version!r}\n")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return directory / name


def fake_index(root: Path, versions: list[str]) -> str:
    """A PEP 503 simple index as a directory; pip reads file:// directories' index.html."""
    project = root / "simple" / "torch"
    project.mkdir(parents=True)
    links = "".join(f'<a href="{fake_wheel(project, v).name}">{fake_wheel(project, v).name}</a>\n' for v in versions)
    (project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    (root / "simple" / "index.html").write_text('<html><body><a href="torch/">torch</a></body></html>\n')
    return (root / "simple").as_uri()


def chosen_torch(tmp_path: Path, user_env: dict[str, str], pypi: str, cpu: str) -> str:
    """The torch version pip would install with launch.sh's words for this user's environment."""
    _, words = torch_source(user_env, False, "", C, cpu_index=cpu)
    report = tmp_path / f"report-{len(list(tmp_path.glob('report-*')))}.json"
    # pip isolated from this machine's config (/etc/xdg/pip caps torch; read, not removed) and its find-links;
    # the fake PyPI stands for pip's default index, which the user's own PIP_INDEX_URL replaces.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update({"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": pypi, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                **{k: v for k, v in user_env.items() if k.startswith("PIP_")}})
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps",
                        "--no-cache-dir", "--report", str(report), "-q", *words, "torch"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (item,) = json.loads(report.read_text())["install"]
    return item["metadata"]["version"]


def test_pip_takes_the_cpu_wheel_by_default_and_respects_the_users_choice(tmp_path):
    pypi = fake_index(tmp_path / "pypi", ["2.13.0", "2.14.0"])  # PyPI: the CUDA build, no local label
    cpu = fake_index(tmp_path / "cpu", ["2.13.0+cpu", "2.14.0+cpu"])  # PyTorch's CPU index
    mirror = fake_index(tmp_path / "mirror", ["2.13.0+mirror"])  # a site's own index
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    fake_wheel(wheels, "2.13.0+local")
    assert chosen_torch(tmp_path, {}, pypi, cpu) == "2.13.0+cpu"  # the default: the pinned CPU wheel
    assert chosen_torch(tmp_path, {"PIP_INDEX_URL": mirror}, pypi, cpu) == "2.13.0+mirror"  # the user's index
    assert chosen_torch(tmp_path, {"CORECPU_TORCH_INDEX": ""}, pypi, cpu) == "2.13.0"  # turned off: pip's index
    assert chosen_torch(tmp_path, {"CORECPU_TORCH_INDEX": str(wheels)}, pypi, cpu) == "2.13.0+local"  # offline


def test_a_missing_extra_names_the_checkouts_install(tmp_path):
    # Issue 27: the fix printed for a missing extra installed the released package from the index, not the checkout.
    from corecpu.errors import install_extra

    (tmp_path / "launch.sh").write_text("")
    assert install_extra("report", tmp_path, cwd=tmp_path) == (
        "./launch.sh --setup-only report (installed from PyPI: pip install 'corecpu[report]')")
    assert install_extra("report", tmp_path, cwd=tmp_path.parent).startswith(f"{tmp_path}/launch.sh --setup-only report")
    assert install_extra("report", tmp_path / "site-packages") == "pip install 'corecpu[report]'"  # installed: no launch.sh
