"""The package's shape: imports only go down the layers, no cycles, few function-level imports
(each with its reason), the torch-free parts import without torch, and the wheel carries it all."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "corecpu"

# Bottom to top: a module may import its own layer (acyclically) and the layers below it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("corecpu.errors", "corecpu.decision", "corecpu.address_space", "corecpu.notices", "corecpu.envvars", "corecpu.cachefile", "corecpu.atomic"),
    ("corecpu.cluster",),
    ("corecpu.cpu",),
    ("corecpu.distributed",),
    ("corecpu.compute",),
    ("corecpu.reliability",),
    ("corecpu.data",),
    ("corecpu.training",),
    ("corecpu.reporting",),
    ("corecpu.tasks",),
    ("corecpu.launching",),
    ("corecpu.cli", "corecpu.bind", "corecpu.launch", "corecpu.install", "corecpu.train", "corecpu"),
)
TORCH_FREE = ("corecpu", "corecpu.errors", "corecpu.decision", "corecpu.address_space", "corecpu.notices", "corecpu.envvars", "corecpu.cachefile", "corecpu.atomic", "corecpu.cluster", "corecpu.cpu", "corecpu.launching",
              "corecpu.reliability.lifeline", "corecpu.data.types", "corecpu.data.builtin", "corecpu.data.qa",
              "corecpu.data.builtin_qa", "corecpu.data.builtin_sft", "corecpu.data.causal_records",
              "corecpu.data.causal_tokens", "corecpu.cli",
              "corecpu.bind", "corecpu.launch", "corecpu.install")
MAX_FUNCTION_LEVEL = 10


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    line: int
    function_level: bool
    text: str


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def edges() -> list[Edge]:
    out = []
    for src, path in MODULES.items():
        text = path.read_text()
        tree, lines = ast.parse(text), text.splitlines()
        in_function = {n.lineno for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                       for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            # TYPE_CHECKING imports count too: a cycle hidden from the interpreter is still one for a reader.
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("corecpu") and not node.level:
                # `from corecpu.x import y`: y may be a submodule (an edge to it) or a name in x.
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                           for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("corecpu")]
            for dst in dict.fromkeys(targets):
                out.append(Edge(src, dst, node.lineno, node.lineno in in_function, lines[node.lineno - 1].strip()))
    return out


def layer(module: str) -> int:
    best = None
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and (best is None or len(name) > len(best[1])):
                best = (i, name)
    assert best is not None, f"{module} is in no layer of LAYERS; add its subpackage there"
    return best[0]


def test_every_module_has_a_layer():
    for module in MODULES:
        layer(module)


def test_imports_only_go_down():
    upward = [f"{e.src}:{e.line} imports {e.dst}" for e in edges() if layer(e.dst) > layer(e.src)]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_import_cycles():
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for e in edges():
        if e.dst in MODULES and e.dst != e.src:
            graph[e.src].add(e.dst)
    cycles, state = [], {m: 0 for m in graph}  # 0 new, 1 on the stack, 2 done

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            if state[d] == 1:
                cycles.append(" -> ".join(stack[stack.index(d):] + [m, d]) if d in stack else f"{m} -> {d}")
            elif state[d] == 0:
                visit(d, stack + [m])
        state[m] = 2

    for m in sorted(graph):
        if state[m] == 0:
            visit(m, [])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_few_function_level_imports_each_with_its_reason():
    found = [e for e in edges() if e.function_level and e.dst in MODULES]
    assert len(found) <= MAX_FUNCTION_LEVEL, "\n".join(f"{e.src}:{e.line}: {e.text}" for e in found)
    lines = {e.src: MODULES[e.src].read_text().splitlines() for e in found}
    unexplained = [f"{e.src}:{e.line}: {e.text}" for e in found
                   if "#" not in e.text and not lines[e.src][e.line - 2].strip().startswith("#")]
    assert not unexplained, "function-level imports without a one-line reason:\n" + "\n".join(unexplained)


def test_this_check_sees_a_cycle_and_an_upward_import(tmp_path, monkeypatch):
    # The checks above must be able to fail: feed them a package with both faults.
    fake = tmp_path / "corecpu"
    (fake / "cpu").mkdir(parents=True)
    (fake / "training").mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "cpu" / "__init__.py").write_text("")
    (fake / "training" / "__init__.py").write_text("")
    (fake / "cpu" / "a.py").write_text("from corecpu.training import b\n")
    (fake / "training" / "b.py").write_text("import corecpu.cpu.a\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "MODULES", {module_name(p): p for p in fake.rglob("*.py")})
    with pytest.raises(AssertionError, match="upward imports"):
        test_imports_only_go_down()
    with pytest.raises(AssertionError, match="import cycles"):
        test_no_import_cycles()


@pytest.mark.parametrize("module", TORCH_FREE)
def test_torch_free_parts_import_without_torch(module):
    names = [m for m in MODULES if m == module or m.startswith(module + ".")] if module != "corecpu" else ["corecpu"]
    code = ("import importlib, sys\n"
            f"for name in {names!r}:\n    importlib.import_module(name)\n"
            "print(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"{module} pulled in {out.stdout.strip()}"


def test_the_wheel_carries_every_subpackage(tmp_path):
    # Built from a copy: setuptools writes build/ and *.egg-info/ beside the sources.
    src = tmp_path / "src"
    shutil.copytree(PACKAGE, src / "corecpu", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path), str(src)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = tmp_path.glob("corecpu-*.whl")
    inside = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(str(p.relative_to(ROOT)) for p in MODULES.values() if str(p.relative_to(ROOT)) not in inside)
    missing += [p for p in ("corecpu/launching/patches/torch-ccl-1fc0c38.patch",) if p not in inside]  # build-ccl's
    assert not missing, f"not in {wheel.name}: {missing}"
