"""corecpu.atomic: files and directories replaced whole, temporaries hidden and per writer, leftovers of
killed writers cleaned, and a directory set aside by a killed fallback swap put back. (The kills
themselves: tests/chaos/test_atomic_writes.py.)"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import socket
import subprocess

import pytest

from corecpu import atomic


@pytest.fixture
def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def names(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_a_write_replaces_the_file_and_leaves_nothing_beside_it(tmp_path):
    target = tmp_path / "summary.json"
    atomic.write_text(target, "old")
    atomic.write_json(target, {"steps": 10}, indent=2)
    assert json.loads(target.read_text()) == {"steps": 10}
    atomic.write_bytes(target, b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    assert names(tmp_path) == ["summary.json"]


def test_an_error_in_the_body_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    target = tmp_path / "config.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic.replacing(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("the writer failed")
    assert target.read_text() == "old" and names(tmp_path) == ["config.json"]


def test_temporaries_are_hidden_and_name_their_host_and_process(tmp_path):
    tmp = atomic.temp_path(tmp_path / "final")
    assert tmp.parent == tmp_path and tmp.name == f".final.tmp-{socket.gethostname()}-{os.getpid()}"
    assert atomic.parse_temp_name(tmp.name) == ("final", "tmp", socket.gethostname(), os.getpid())
    assert atomic.parse_temp_name(".step-00000005.old-node-3.x-77") == ("step-00000005", "old", "node-3.x", 77)
    for other in ("final", ".step-00000005.tmp-77", ".step-00000005.old-77", ".corecpu-lock", ".x.tmp-host-pid"):
        assert atomic.parse_temp_name(other) is None  # a prune's .old-PID is never one to put back


def test_a_directory_is_replaced_whole_by_a_swap(tmp_path, monkeypatch):
    final = tmp_path / "final"
    final.mkdir()
    (final / "old.bin").write_text("old")
    swaps = []
    real = atomic._exchange
    monkeypatch.setattr(atomic, "_exchange", lambda a, b: swaps.append(real(a, b)) or swaps[-1])
    with atomic.replacing_dir(final) as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "new.bin").write_text("new")
    assert (final / "sub" / "new.bin").read_text() == "new" and not (final / "old.bin").exists()
    assert names(tmp_path) == ["final"]
    assert swaps == [atomic._renameat2() is not None]  # renameat2 where the C library has it (glibc >= 2.28)


def test_without_a_swap_the_old_directory_is_set_aside_then_deleted(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    final = tmp_path / "final"
    final.mkdir()
    (final / "old.bin").write_text("old")
    with atomic.replacing_dir(final) as tmp:
        (tmp / "new.bin").write_text("new")
    assert names(final) == ["new.bin"] and names(tmp_path) == ["final"]


def test_the_fallback_puts_the_old_directory_back_when_the_new_one_cannot_go_in(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    real, calls = os.rename, []

    def rename(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(errno.EIO, "the disk failed")
        real(src, dst)

    monkeypatch.setattr(atomic.os, "rename", rename)
    final = tmp_path / "final"
    final.mkdir()
    (final / "old.bin").write_text("old")
    with pytest.raises(OSError, match="the disk failed"), atomic.replacing_dir(final) as tmp:
        (tmp / "new.bin").write_text("new")
    assert names(final) == ["old.bin"] and names(tmp_path) == ["final"]


def test_a_directory_into_an_empty_place_and_an_error_while_writing_it(tmp_path):
    final = tmp_path / "final"
    with pytest.raises(RuntimeError), atomic.replacing_dir(final) as tmp:
        (tmp / "half.bin").write_text("half")
        raise RuntimeError("save_pretrained failed")
    assert names(tmp_path) == []
    with atomic.replacing_dir(final) as tmp:
        (tmp / "new.bin").write_text("new")
    assert names(final) == ["new.bin"]


def test_place_dir_keeps_the_first_complete_copy(tmp_path):
    target = tmp_path / "model"
    for i in (1, 2):
        built = atomic.temp_path(target)
        built.mkdir()
        (built / "w.bin").write_text(f"build {i}")
        assert atomic.place_dir(built, target) == (i == 1)  # the second finds the first in place
    assert (target / "w.bin").read_text() == "build 1" and names(tmp_path) == ["model"]
    (tmp_path / "file").write_text("x")
    built.mkdir()
    with pytest.raises(OSError):
        atomic.place_dir(built, tmp_path / "file")  # not another writer's directory: an error, not a loss


@pytest.mark.parametrize("err, falls_back", [(errno.EINVAL, True), (errno.ENOSYS, True), (errno.EACCES, False)])
def test_a_system_that_cannot_swap_falls_back_and_other_errors_are_raised(tmp_path, monkeypatch, err, falls_back):
    def fail(*args):
        ctypes.set_errno(err)
        return -1

    monkeypatch.setattr(atomic, "_renameat2", lambda: fail)
    if falls_back:
        assert atomic._exchange(tmp_path / "a", tmp_path / "b") is False
    else:
        with pytest.raises(PermissionError):
            atomic._exchange(tmp_path / "a", tmp_path / "b")


def test_leftovers_of_writers_that_are_gone_are_removed_by_the_next_write(tmp_path, dead_pid):
    here = socket.gethostname()
    gone = [tmp_path / f".config.json.tmp-{here}-{dead_pid}", tmp_path / f".final.tmp-{here}-{dead_pid}"]
    kept = [tmp_path / f".config.json.tmp-{here}-{os.getppid()}",  # a writer still running
            tmp_path / f".config.json.tmp-elsewhere-{dead_pid}",   # another host's: cannot be checked from here
            tmp_path / f".other.json.tmp-{here}-{dead_pid}"]       # another target's: its own next write
    gone[0].write_text("half")
    gone[1].mkdir()
    (gone[1] / "model.safetensors").write_text("half")
    for p in kept:
        p.write_text("half")
    atomic.write_text(tmp_path / "config.json", "new")
    with atomic.replacing_dir(tmp_path / "final") as tmp:
        (tmp / "model.safetensors").write_text("new")
    assert names(tmp_path) == sorted(["config.json", "final", *(p.name for p in kept)])


def test_a_directory_set_aside_by_a_killed_writer_is_put_back(tmp_path, dead_pid):
    here = socket.gethostname()
    aside = tmp_path / f".final.old-{here}-{dead_pid}"
    aside.mkdir()
    (aside / "model.safetensors").write_text("old")
    running = tmp_path / f".other.old-{here}-{os.getppid()}"  # its writer may rename the new one in any moment
    running.mkdir()
    notes = atomic.recover_all(tmp_path)
    assert notes == [f"restored {tmp_path / 'final'} from {aside.name}, set aside by a write that was killed"]
    assert (tmp_path / "final" / "model.safetensors").read_text() == "old" and running.exists()
    assert atomic.recover_all(tmp_path) == []  # the target exists: nothing to do
