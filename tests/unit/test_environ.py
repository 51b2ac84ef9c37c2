"""Who touches os.environ: the edge reads the environment, once per concern, and passes values down; library
code takes a mapping as a parameter. And importing corecpu leaves os.environ exactly as it was."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "corecpu"

# Modules that may name os.environ (or os.getenv / putenv / unsetenv), each with its reason. A new one fails
# below: take a `env: Mapping[str, str]` parameter from the caller instead, or add it here with its reason.
ALLOWED = {
    "corecpu.launching": "the launch edge: launch.sh's and `corecpu launch`'s environment for the ranks it starts",
    "corecpu.cli": "the CLI edge: `corecpu plan` reads the launcher's variables for its binding",
    "corecpu.training.connector": "setup(env=None): the rank's environment, read once and passed down",
    "corecpu.reporting.reporter": "Reporter(env=None): reporting's variables (CORECPU_TTY, launcher PID, trackers')",
    "corecpu.reporting.trackers": "MLflow refuses a file store unless MLFLOW_ALLOW_FILE_STORE is in the process env",
    "corecpu.envvars": "cache_dir(): the one reader of CORECPU_CACHE_DIR / XDG_CACHE_HOME",
    "corecpu.notices": "warn(env=os.environ): which rank speaks, for warnings from code that has no env of setup()'s",
    "corecpu.data.hf": "datasets reads HF_*_OFFLINE from the process env at import: scoped() around it",
    "corecpu.distributed.shm_allreduce": "torch's cpp_extension and DeepSpeed's op read the process env: scoped()",
    "corecpu.distributed.allreduce": "MpiGradientAllreduce built without setup()'s node plan (tests, own loops)",
    "corecpu.reliability.lifeline": "ask_launcher_to_end_job() from the watchdog, which has no env of setup()'s",
    "corecpu.cpu.topology": "detect_topology()'s library search for callers without an env (bind, `corecpu plan`)",
    "corecpu.distributed.process_group": "init_distributed(env=None) for callers without setup() (tests, scripts)",
}
ENV_FUNCTIONS = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def environ_lines(path: Path) -> list[int]:
    """Lines naming os.environ (or os.getenv, ...), as an attribute of `os` or imported from it."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os"
                and node.attr in ENV_FUNCTIONS):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and {a.name for a in node.names} & ENV_FUNCTIONS:
            lines.append(node.lineno)
    return sorted(lines)


def allowed(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in ALLOWED)


def touching(package: Path) -> dict[str, list[int]]:
    return {module_name(p, package.parent): lines for p in sorted(package.rglob("*.py")) if (lines := environ_lines(p))}


def test_only_the_listed_modules_touch_os_environ():
    found = touching(PACKAGE)
    new = [f"{m} (line {', '.join(map(str, lines))})" for m, lines in found.items() if not allowed(m)]
    assert not new, ("these modules name os.environ; take an `env` mapping from the caller that reads the "
                     "environment, or list the module in ALLOWED with its reason:\n" + "\n".join(new))
    stale = [name for name in ALLOWED if not any(m == name or m.startswith(name + ".") for m in found)]
    assert not stale, f"no longer touch os.environ, remove from ALLOWED: {stale}"


def test_the_scan_sees_every_spelling(tmp_path):
    package = tmp_path / "corecpu"
    package.mkdir()
    (package / "a.py").write_text("import os\nX = os.environ.get('A')\n")
    (package / "b.py").write_text("from os import environ\n")
    (package / "c.py").write_text("import os\nos.putenv('A', '1')\n")
    (package / "d.py").write_text("import os\n'''os.environ in a docstring'''\nY = os.path\n")
    assert touching(package) == {"corecpu.a": [2], "corecpu.b": [1], "corecpu.c": [2]}


# Runs in a fresh interpreter: records which file wrote each variable of os.environ while `modules` import.
_PROBE = r"""
import importlib, json, os, sys
writers = {}
Environ = type(os.environ)
set_item, del_item = Environ.__setitem__, Environ.__delitem__

def writer():
    frame = sys._getframe(2)
    while frame and frame.f_globals.get("__name__") in ("os", "_collections_abc"):  # setdefault, update, pop
        frame = frame.f_back
    return frame.f_code.co_filename if frame else "?"

def setitem(self, key, value):
    writers.setdefault(key, writer())
    set_item(self, key, value)

def delitem(self, key):
    writers.setdefault(key, writer())
    del_item(self, key)

Environ.__setitem__, Environ.__delitem__ = setitem, delitem
before = dict(os.environ)
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))
print(json.dumps({k: writers.get(k, "?") for k in changed}))
"""


def changed_at_import(modules: list[str], path: Path) -> dict[str, str]:
    """{variable: the file that wrote it} for each variable importing `modules` (from `path`) changed.
    A minimal environment, so a setdefault() of any variable is a change."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "PYTHONPATH": str(path), "LANG": "C.UTF-8"}
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(modules)], capture_output=True, text=True,
                         cwd=path, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def by_package(changes: dict[str, str], package: Path) -> dict[str, str]:
    return {k: w for k, w in changes.items() if Path(w).resolve().is_relative_to(package.resolve())}


def test_importing_every_module_leaves_os_environ_unchanged():
    modules = sorted(module_name(p, ROOT) for p in PACKAGE.rglob("*.py") if p.name != "__main__.py")
    changes = changed_at_import(modules, ROOT)
    assert not by_package(changes, PACKAGE), f"importing corecpu changed os.environ: {by_package(changes, PACKAGE)}"


def test_the_import_check_sees_a_module_that_writes_at_import(tmp_path):
    # What corecpu.training.modeling once did: switch the hub off for the whole process at import.
    package = tmp_path / "corecpu_probe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "offline.py").write_text("import os\nos.environ.setdefault('HF_HUB_OFFLINE', '1')\n")
    changes = changed_at_import(["corecpu_probe.offline"], tmp_path)
    assert by_package(changes, package) == {"HF_HUB_OFFLINE": str(package / "offline.py")}
