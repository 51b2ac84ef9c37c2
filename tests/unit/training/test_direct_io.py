"""A checkpoint part written around the page cache (corecpu.training.direct_io): the exact bytes, the digest of
them, O_DIRECT where the filesystem takes it and the ordinary write where it does not."""

from __future__ import annotations

import errno
import hashlib
import os

import pytest
import torch

from corecpu.training import direct_io

pytestmark = pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="O_DIRECT is Linux's")


def save_state(size: int):  # noqa: ANN201
    state = {"a": torch.arange(size, dtype=torch.float32), "b": [torch.ones(3, dtype=torch.int8), "text", 7]}
    return state, lambda stream: torch.save(state, stream)


def check(path, state, size: int, digest: str) -> None:
    data = path.read_bytes()
    assert len(data) == size and hashlib.sha256(data).hexdigest() == digest
    back = torch.load(path, weights_only=True)
    assert torch.equal(back["a"], state["a"]) and torch.equal(back["b"][0], state["b"][0]) and back["b"][1:] == ["text", 7]


@pytest.mark.parametrize("elements", [0, 1, 1023, 5000, 300_001])
def test_the_file_holds_exactly_what_was_saved_and_its_digest(tmp_path, monkeypatch, elements):
    monkeypatch.setattr(direct_io, "STAGING", 8 * direct_io.BLOCK)  # many full buffers, then a partial block
    opened = []
    real_open = os.open
    monkeypatch.setattr(direct_io.os, "open", lambda p, flags, *a: opened.append(flags) or real_open(p, flags, *a))
    state, save = save_state(elements)
    size, digest = direct_io.write_digested(tmp_path / "part.pt", save, "sha256")
    check(tmp_path / "part.pt", state, size, digest)
    try:  # whether this filesystem takes O_DIRECT decides which path the test saw
        os.close(real_open(tmp_path / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT))
        assert opened and opened[0] & os.O_DIRECT
    except OSError:
        pass


def test_a_filesystem_that_refuses_o_direct_at_open_gets_the_ordinary_write(tmp_path, monkeypatch):
    real_open = os.open

    def no_direct(path, flags, *args):  # noqa: ANN001, ANN202 - as tmpfs answers
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(direct_io.os, "open", no_direct)
    state, save = save_state(70_000)
    size, digest = direct_io.write_digested(tmp_path / "part.pt", save, "sha256")
    check(tmp_path / "part.pt", state, size, digest)


def writes_fail(monkeypatch, code: int) -> None:
    """Every write of the direct path (only it calls os.write) fails with `code`, mid-stream inside torch.save."""
    def fail(fd, data):  # noqa: ANN001, ANN202
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(direct_io.os, "write", fail)
    monkeypatch.setattr(direct_io, "STAGING", 2 * direct_io.BLOCK)


def test_one_that_opens_with_o_direct_but_refuses_the_writes_is_written_again_the_ordinary_way(tmp_path, monkeypatch):
    writes_fail(monkeypatch, errno.EINVAL)
    state, save = save_state(70_000)
    size, digest = direct_io.write_digested(tmp_path / "part.pt", save, "sha256")
    check(tmp_path / "part.pt", state, size, digest)


def test_other_errors_are_not_swallowed(tmp_path, monkeypatch):
    writes_fail(monkeypatch, errno.ENOSPC)
    _, save = save_state(70_000)
    try:
        os.close(os.open(tmp_path / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT))
    except OSError:
        pytest.skip("this filesystem refuses O_DIRECT: the buffered path does not call os.write")
    with pytest.raises((OSError, RuntimeError)) as info:  # torch.save may wrap it in its own RuntimeError
        direct_io.write_digested(tmp_path / "part.pt", save, "sha256")
    assert direct_io._caused_by(info.value, errno.ENOSPC)
