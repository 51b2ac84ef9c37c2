"""corecpu build-ccl's pure parts and its checks on bad input: source settings, verification, cache keys."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from corecpu.errors import CoreCPUError
from corecpu.launching import build_ccl as bc
from corecpu.launching import ccl_source as cs

ROOT = Path(__file__).resolve().parents[3]


def test_source_settings_name_their_kind(tmp_path):
    tarball = tmp_path / "src.tar.gz"
    tarball.write_bytes(b"")
    assert cs.parse_source(str(tmp_path)) == cs.Source("dir", str(tmp_path))
    assert cs.parse_source(str(tarball)) == cs.Source("tarball", str(tarball))
    assert cs.parse_source(cs.DEFAULT_SOURCE) == cs.Source("git", cs.UPSTREAM_URL, cs.COMMIT)
    assert cs.parse_source(f"git+file:///x/repo@{'A' * 40}") == cs.Source("git", "file:///x/repo", "a" * 40)


@pytest.mark.parametrize("setting, says", [
    ("/nowhere/torch-ccl.tar.gz", "does not exist"),
    ("https://github.com/intel/torch-ccl.git@main", "URL@COMMIT"),  # a branch is not a pin
    ("torch-ccl", "neither a directory"),
])
def test_bad_source_settings_say_what_to_do(setting, says):
    with pytest.raises(CoreCPUError, match=says):
        cs.parse_source(setting)


def _tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("a")
    (root / "sub" / "b.txt").write_text("b")
    return root


def test_tree_digest_depends_on_content_and_names_only(tmp_path):
    one, two = _tree(tmp_path / "one"), _tree(tmp_path / "two")
    (two / ".git").mkdir()
    (two / ".git" / "HEAD").write_text("ref")  # a clone's metadata does not count
    assert cs.tree_digest(one) == cs.tree_digest(two)
    (two / "sub" / "b.txt").write_text("B")
    assert cs.tree_digest(one) != cs.tree_digest(two)


def test_a_directory_source_is_verified_against_the_pin(tmp_path):
    src = _tree(tmp_path / "src")
    with pytest.raises(CoreCPUError, match="not the pinned"):
        cs.fetch_source(cs.Source("dir", str(src)), tmp_path / "work")
    tree, digest = cs.fetch_source(cs.Source("dir", str(src)), tmp_path / "work2", expect_tree=cs.tree_digest(src))
    assert (tree / "sub" / "b.txt").read_text() == "b" and digest == cs.tree_digest(src)


def test_a_tarball_with_another_sha256_is_refused_before_it_is_opened(tmp_path):
    fake = tmp_path / "torch-ccl-1fc0c38.tar.gz"
    with tarfile.open(fake, "w:gz") as tar:
        info = tarfile.TarInfo("torch-ccl-1fc0c38/setup.py")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    with pytest.raises(CoreCPUError, match=f"not the pinned {cs.TARBALL_SHA256}"):
        cs.fetch_source(cs.Source("tarball", str(fake)), tmp_path / "work")
    assert not (tmp_path / "work" / "src").exists()


VENDORED = ROOT.parent / "shared" / "vendor" / "torch-ccl-1fc0c38.tar.gz"


@pytest.mark.skipif(not VENDORED.exists(), reason=f"no vendored source at {VENDORED}")
def test_the_vendored_tarball_matches_both_pins_and_takes_the_patch(tmp_path):
    tree, digest = cs.fetch_source(cs.Source("tarball", str(VENDORED)), tmp_path / "work")
    assert digest == cs.TREE_SHA256
    applied = subprocess.run(["patch", "-p1", "--forward", "--batch", "--dry-run", "-i", str(bc.PATCH)], cwd=tree,
                             capture_output=True, text=True)
    assert applied.returncode == 0, applied.stdout


def test_cache_key_changes_with_each_input():
    t = bc.Target("py", Path("/env"), "2.13.0+cpu", "cp311")
    keys = {bc.cache_key(t, patch="p1"), bc.cache_key(t, patch="p2"), bc.cache_key(t, oneccl="2021.17", patch="p1"),
            bc.cache_key(bc.Target("py", Path("/env"), "2.8.0+cpu", "cp311"), patch="p1"),
            bc.cache_key(bc.Target("py", Path("/env"), "2.13.0+cpu", "cp312"), patch="p1"),
            bc.cache_key(t, tree="0" * 64, patch="p1")}
    assert len(keys) == 6


def test_wheel_version_matches_torch_minor_release_for_the_backend_check():
    from corecpu.cpu.hardware import _matches_torch  # noqa: PLC2701 - the very check the version must pass

    assert bc.wheel_version("2.13.0+cpu") == f"2.13.0+corecpu.{cs.COMMIT[:7]}"
    assert bc.wheel_version("2.8.0") .startswith("2.8.0+")
    assert _matches_torch(bc.wheel_version(__import__("importlib.metadata").metadata.version("torch")))


def test_torch_missing_or_too_old_is_a_one_line_error():
    with pytest.raises(CoreCPUError, match="no torch in the environment"):
        bc.check_torch(None, sys.executable)
    with pytest.raises(CoreCPUError, match="older than"):
        bc.check_torch("2.7.1+cpu", sys.executable)
    bc.check_torch("2.13.0+cpu", sys.executable)


def test_build_env_asks_for_the_system_oneccl_and_honours_jobs(tmp_path):
    env = bc.build_env({"PATH": "/bin", "COMPUTE_BACKEND": "dpcpp"}, tmp_path, 3)
    assert env["USE_SYSTEM_ONECCL"] == "1" and env["CCL_ROOT"] == str(tmp_path) and env["MAX_JOBS"] == "3"
    assert "COMPUTE_BACKEND" not in env and env["PATH"] == "/bin"


def test_cli_rejects_a_bad_source_before_building(tmp_path):
    out = subprocess.run([sys.executable, "-m", "corecpu.cli", "build-ccl", "--source", str(tmp_path / "x.tar.gz")],
                         capture_output=True, text=True, cwd=ROOT, env={"PATH": "/usr/bin:/bin",
                                                                       "CORECPU_CACHE_DIR": str(tmp_path / "c")})
    assert out.returncode != 0
    assert out.stderr.strip().count("\n") == 0 and "does not exist" in out.stderr


def test_a_failed_install_is_rolled_back(tmp_path, monkeypatch):
    """Nothing half-installed: if the bindings' wheel does not install, oneCCL and libccl.so.2 go again."""
    env = tmp_path / "env"
    (env / "lib").mkdir(parents=True)
    genuine = tmp_path / "libccl.so.2"
    genuine.write_bytes(b"intel")
    calls: list[tuple[str, ...]] = []

    def fake_pip(target, *args, log=None):
        calls.append(args)
        if args[-1].endswith(".whl"):
            raise CoreCPUError("pip install failed: no space left on device")

    monkeypatch.setattr(bc, "_pip", fake_pip)
    monkeypatch.setattr(bc, "libccl2", lambda target, cache: genuine)
    ran: list[list[str]] = []
    monkeypatch.setattr(bc.subprocess, "run", lambda cmd, **kw: ran.append(cmd))
    target = bc.Target(sys.executable, env, "2.13.0+cpu", "cp311")
    with pytest.raises(CoreCPUError, match="no space left"):
        bc.install(target, tmp_path / "oneccl_bind_pt-2.13.0-cp311.whl", tmp_path, bc.Report())
    assert calls[0][-1] == f"oneccl-cpu=={bc.ONECCL}"  # it got as far as oneCCL ...
    assert not (env / "lib" / "libccl.so.2").exists()  # ... and took it all back
    assert "uninstall" in ran[-1] and ran[-1][-2:] == [bc.DIST_NAME, "oneccl-cpu"]


def test_wheel_only_keeps_a_cached_wheel_and_leaves_the_environment_alone(tmp_path, monkeypatch, capsys):
    """`build-ccl --wheel-only` (CI builds beside the tests this way): a cached wheel is found, nothing installed."""
    target = bc.Target(sys.executable, tmp_path / "env", "2.13.0+cpu", "cp311")
    monkeypatch.setattr(bc, "target_of", lambda: target)
    kept = tmp_path / "ccl" / bc.cache_key(target, patch=bc.patch_digest())
    kept.mkdir(parents=True)
    (kept / f"{bc.DIST_NAME}-2.13.0+corecpu.1fc0c38-cp311-cp311-linux_x86_64.whl").write_bytes(b"wheel")
    monkeypatch.setattr(bc, "install", lambda *a: pytest.fail("--wheel-only installed the wheel"))
    monkeypatch.setattr(bc, "build_wheel", lambda *a: pytest.fail("a cached wheel was built again"))
    bc.build_ccl(env={"CORECPU_CACHE_DIR": str(tmp_path)}, install_wheel=False)
    assert "not installed (--wheel-only)" in capsys.readouterr().out
