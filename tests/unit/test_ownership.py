"""State has one owner: no corecpu module writes another object's private attribute.

An object's `_x` is written by its own methods (`self._x = ...`), or, for a module's private global
(`_state` in reliability/preempt.py), by that module. Reaching into another object (`run._late.step = n`)
is how an owner stops being one; this scan fails on it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "corecpu"
# Another library's private state that corecpu patches on purpose: (file, target) -> why.
PATCHES = {
    ("launching/torchrun.py", "api._terminate_process_handler"):
        "torch's elastic agent: raise on the first stop signal only (torchrun.one_stop_signal)",
}


def foreign_writes(source: str) -> list[str]:
    tree = ast.parse(source)
    own_globals = {t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                   for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    found = []
    for node in ast.walk(tree):
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        calls = [node] if isinstance(node, ast.Call) and ast.unparse(node.func) in ("setattr", "object.__setattr__") else []
        for target in targets:
            for sub in ast.walk(target):
                if not (isinstance(sub, ast.Attribute) and sub.attr.startswith("_") and not sub.attr.startswith("__")):
                    continue
                base = sub.value
                if isinstance(base, ast.Name) and (base.id in ("self", "cls") or
                                                   (base.id.startswith("_") and base.id in own_globals)):
                    continue
                found.append(f"{node.lineno}: {ast.unparse(target)}")
        for call in calls:
            name = call.args[1] if len(call.args) > 1 else None
            if isinstance(name, ast.Constant) and str(name.value).startswith("_"):
                found.append(f"{call.lineno}: {ast.unparse(call)}")
    return found


def test_no_module_writes_another_objects_private_state():
    found = [f"{p.relative_to(PACKAGE.parent)}:{w}" for p in sorted(PACKAGE.rglob("*.py"))
             for w in foreign_writes(p.read_text())
             if (str(p.relative_to(PACKAGE)), w.split(": ", 1)[1]) not in PATCHES]
    assert not found, "private state written from outside its owner:\n" + "\n".join(found)


def test_the_scan_sees_a_foreign_write():
    assert foreign_writes("def f(run):\n    run._late.step = 3\n") == ["2: run._late.step"]
    assert foreign_writes("def f(run):\n    object.__setattr__(run, '_x', 1)\n")
    assert foreign_writes("_state = S()\ndef f():\n    _state._fd = 1\n") == []  # the module's own global
    assert foreign_writes("class A:\n    def f(self):\n        self._x = 1\n") == []
