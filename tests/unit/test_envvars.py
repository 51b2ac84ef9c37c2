"""Every CORECPU_* variable is named in corecpu/envvars.py, and only there in the package's code."""

from __future__ import annotations

import ast
import os
import re
import tempfile
from pathlib import Path

from corecpu import envvars

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"\bCORECPU_[A-Z_]+\b")
SHELL_AND_DOCS = ["launch.sh", "test.sh", "tests/ipex_env.sh", "Dockerfile", "README.md", "docs", "examples"]


def mentioned(text: str) -> set[str]:
    return set(NAME.findall(text))


def code_literals(path: Path) -> set[str]:
    """CORECPU_* names in a module's string constants that are not docstrings (i.e. used as values)."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return {name for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings for name in mentioned(node.value)}


def test_every_name_used_anywhere_is_in_envvars():
    files = [p for entry in SHELL_AND_DOCS for p in ((ROOT / entry).rglob("*") if (ROOT / entry).is_dir()
                                                     else [ROOT / entry]) if p.is_file()]
    files += list((ROOT / "corecpu").rglob("*.py"))
    used = {name: f for f in files for name in mentioned(f.read_text(errors="replace"))}
    unknown = {name: str(f.relative_to(ROOT)) for name, f in used.items() if name not in envvars.ALL}
    assert not unknown, f"not in corecpu/envvars.py: {unknown}"
    assert envvars.TORCH_INDEX in mentioned((ROOT / "launch.sh").read_text())
    assert envvars.CACHE_DIR in mentioned((ROOT / "tests/ipex_env.sh").read_text())


def test_the_package_spells_them_only_in_envvars():
    literal = {str(p.relative_to(ROOT)): code_literals(p) for p in (ROOT / "corecpu").rglob("*.py")
               if p.name != "envvars.py"}
    assert not {k: v for k, v in literal.items() if v}, "use the names in corecpu.envvars instead"


def test_the_literal_check_sees_a_literal(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""Mentions CORECPU_BOUND_CPUS in a docstring: fine."""\nX = "CORECPU_BOUND_CPUS"\n')
    assert code_literals(module) == {"CORECPU_BOUND_CPUS"}


def test_cache_dir_order(tmp_path):
    assert envvars.cache_dir({envvars.CACHE_DIR: str(tmp_path / "c"), "XDG_CACHE_HOME": "/x"}) == tmp_path / "c"
    assert envvars.cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "corecpu"
    assert envvars.cache_dir({}).parts[-2:] == (".cache", "corecpu")
    assert envvars.cache_dir({"HOME": str(tmp_path)}) == tmp_path / ".cache" / "corecpu"


def test_a_home_that_does_not_exist_is_not_created(tmp_path, capsys, monkeypatch):
    # Issue 30 case 11(c): the cache's mkdir(parents=True) created a missing HOME.
    from corecpu import notices

    monkeypatch.setattr(notices, "_said", set())
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    home = tmp_path / "nobody"
    path = envvars.cache_dir({"HOME": str(home)})
    path.mkdir(parents=True)  # what every cache writer does
    assert not home.exists() and path == tmp_path / "tmp" / f"corecpu-cache-{os.getuid()}"
    assert envvars.cache_dir({"HOME": str(home), "PMI_RANK": "1", "MPI_LOCALRANKID": "1"}) == path
    err = capsys.readouterr().err
    assert err == (f"corecpu: warning: HOME ({home}) does not exist and is not created; caching measurements and "
                   f"tokenized data in {path} instead (set CORECPU_CACHE_DIR to choose the place)\n")


def test_scoped_sets_unsets_and_restores_exactly():
    env = {"KEPT": "old", "GONE": "here"}
    with envvars.scoped(env, KEPT="new", GONE=None, ADDED="1") as inside:
        assert inside is env and env == {"KEPT": "new", "ADDED": "1"}
    assert env == {"KEPT": "old", "GONE": "here"}  # ADDED unset again, GONE set again, order of keys aside


def test_scoped_restores_when_the_block_raises():
    env = {"A": "1"}
    try:
        with envvars.scoped(env, A="2", B="3"):
            raise KeyError("boom")
    except KeyError:
        pass
    assert env == {"A": "1"}


def test_scoped_changes_the_process_environment_only_when_given_it(monkeypatch):
    import os

    monkeypatch.delenv("SCOPED_TEST_PROBE", raising=False)
    with envvars.scoped(os.environ, SCOPED_TEST_PROBE="1"):
        assert os.environ["SCOPED_TEST_PROBE"] == "1"
    assert "SCOPED_TEST_PROBE" not in os.environ
