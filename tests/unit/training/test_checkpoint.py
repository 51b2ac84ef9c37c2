"""Tier 1: checkpoints on a plain nn.Module: round trip, integrity, fallback, leftovers, disk full.
Two ranks: tests/multiprocess/test_checkpoint_ranks.py."""

from __future__ import annotations

import errno
import json
import os
import random
import re
import subprocess
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
import torch

from corecpu.training import checkpoint_state as ckpt
from corecpu.training import checkpoint_disk as store
from corecpu.errors import CoreCPUError

Usage = namedtuple("Usage", "total used free")


def trained(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for _ in range(3):
        model(torch.randn(5, 4)).sum().backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    return model, opt, sched


def save(out: Path, step: int, model, opt, sched=None, **kw) -> Path:
    return ckpt.save(out, step=step, model=model, optimizer=opt, scheduler=sched, **kw)


def draws() -> tuple:
    return torch.rand(3).tolist(), random.random(), np.random.rand()


@pytest.mark.parametrize("with_scheduler", [True, False])
def test_round_trip_restores_weights_optimizer_scheduler_position_and_every_rng(tmp_path, with_scheduler):
    model, opt, sched = trained()
    sched = sched if with_scheduler else None
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    expected = draws()
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    path = save(tmp_path, 30, model, opt, sched, epoch=2, batches_in_epoch=5, extra={"best": 0.5})
    assert path == tmp_path / "checkpoints" / "step-00000030"

    fresh, fresh_opt, fresh_sched = trained(seed=1)
    fresh_sched = fresh_sched if with_scheduler else None
    torch.manual_seed(99), random.seed(99), np.random.seed(99)
    loop = ckpt.resume(tmp_path, "auto", model=fresh, optimizer=fresh_opt, scheduler=fresh_sched)
    assert (loop.step, loop.epoch, loop.batches_in_epoch, loop.extra) == (30, 2, 5, {"best": 0.5})
    assert loop.path == path and loop.notes == []
    assert draws() == expected  # torch, python and numpy streams continue where the save left them
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values()):
        assert torch.equal(a, b)
    assert str(fresh_opt.state_dict()) == str(opt.state_dict())
    if with_scheduler:
        assert fresh_sched.state_dict() == sched.state_dict()


def test_wrapped_model_saves_unwrapped_keys(tmp_path):
    model, opt, _ = trained()
    save(tmp_path, 1, torch.compile(model), opt)  # compiles nothing until called; wraps as _orig_mod
    state = torch.load(tmp_path / "checkpoints" / "step-00000001" / "state.pt", weights_only=True)
    assert set(state["model"]) == set(model.state_dict())


def test_a_child_named_module_is_part_of_the_model(tmp_path):
    model, opt, _ = trained()
    outer = torch.nn.Module()
    outer.module, outer.head = model, torch.nn.Linear(2, 1)  # not a wrapper: its own child called "module"
    save(tmp_path, 1, outer, opt)
    state = torch.load(tmp_path / "checkpoints" / "step-00000001" / "state.pt", weights_only=True)
    assert set(state["model"]) == set(outer.state_dict()) and any(k.startswith("head.") for k in state["model"])


def test_fresh_start_and_empty_directory(tmp_path):
    model, opt, _ = trained()
    assert ckpt.resume(tmp_path, "", model=model, optimizer=opt) is None
    assert ckpt.resume(tmp_path, "auto", model=model, optimizer=opt) is None


def test_keep_last_k_by_save_time_not_step(tmp_path):
    model, opt, _ = trained()
    for step in (180, 189, 10, 20):  # an older, longer run, then a fresh run into the same directory
        save(tmp_path, step, model, opt, keep=2)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000010", "step-00000020"]
    assert ckpt.resume(tmp_path, "auto", model=model, optimizer=opt).step == 20


def test_meta_records_size_and_checksum_of_state(tmp_path):
    model, opt, _ = trained()
    path = save(tmp_path, 3, model, opt, config={"lr": 0.1})
    meta = json.loads((path / "meta.json").read_text())
    assert meta["files"]["state.pt"]["bytes"] == (path / "state.pt").stat().st_size
    assert meta["files"]["state.pt"]["sha256"] == store.file_digest(path / "state.pt")
    assert sorted(p.name for p in path.iterdir()) == ["meta.json", "state.pt"]


def damage(path: Path, how: str) -> None:
    state = path / "state.pt"
    if how == "truncated":
        state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    elif how == "empty":
        state.write_bytes(b"")
    elif how == "missing":
        state.unlink()
    elif how == "flipped":
        data = bytearray(state.read_bytes())
        data[len(data) // 2] ^= 0xFF
        state.write_bytes(bytes(data))
    elif how == "corrupt meta":
        (path / "meta.json").write_text('{"step": 20, "files": {')


@pytest.mark.parametrize("how, reason", [
    ("truncated", "state.pt has .* bytes, meta.json records .* \\(truncated\\)"),
    ("empty", "state.pt is empty"),
    ("missing", "state.pt is missing"),
    ("flipped", "does not match its checksum"),
    ("corrupt meta", "meta.json is not valid JSON"),
])
def test_damaged_newest_checkpoint_falls_back_to_the_previous_with_a_note(tmp_path, how, reason):
    model, opt, sched = trained()
    save(tmp_path, 10, model, opt, sched)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    trained_more, opt2, sched2 = trained(seed=3)
    newest = save(tmp_path, 20, trained_more, opt2, sched2)
    damage(newest, how)
    fresh, fresh_opt, fresh_sched = trained(seed=5)
    loop = ckpt.resume(tmp_path, "auto", model=fresh, optimizer=fresh_opt, scheduler=fresh_sched)
    assert loop.step == 10
    assert len(loop.notes) == 1 and loop.notes[0].startswith(f"skipped checkpoint {newest}: "), loop.notes
    assert re.search(reason, loop.notes[0]), loop.notes[0]
    assert all(torch.equal(expected[k], v) for k, v in fresh.state_dict().items())


def test_no_checkpoint_verifies_is_an_error_not_a_fresh_start(tmp_path):
    model, opt, _ = trained()
    damage(save(tmp_path, 10, model, opt), "truncated")
    with pytest.raises(CoreCPUError, match=r"no checkpoint in .* can be resumed \(.*step-00000010: state.pt has"):
        ckpt.resume(tmp_path, "auto", model=model, optimizer=opt)


def test_explicit_damaged_checkpoint_is_refused_in_one_line(tmp_path):
    model, opt, _ = trained()
    path = save(tmp_path, 10, model, opt)
    damage(path, "empty")
    with pytest.raises(CoreCPUError, match=r"cannot resume from .*step-00000010: state.pt is empty") as err:
        ckpt.resume(tmp_path, str(path), model=model, optimizer=opt)
    assert "\n" not in str(err.value)
    with pytest.raises(CoreCPUError, match="meta.json is missing"):
        ckpt.resume(tmp_path, str(tmp_path), model=model, optimizer=opt)


def test_format_1_checkpoints_without_digests_still_resume(tmp_path):
    model, opt, sched = trained()
    path = save(tmp_path, 10, model, opt, sched)
    meta = json.loads((path / "meta.json").read_text())
    old = {k: meta[k] for k in ("step", "epoch", "batches_in_epoch", "world_size", "saved_at", "config")}
    (path / "meta.json").write_text(json.dumps({**old, "best": 1}))
    loop = ckpt.resume(tmp_path, "auto", model=model, optimizer=opt, scheduler=sched)
    assert loop.step == 10 and loop.extra == {"best": 1}


def test_label_mismatch_is_reported_as_labels_not_as_model(tmp_path):
    model, opt, _ = trained()
    save(tmp_path, 10, model, opt, config={"model": "tiny", "label_names": ["neg", "pos"]})
    with pytest.raises(CoreCPUError, match=r"labels \['neg', 'pos'\] and this run has \['bad', 'good'\]"):
        ckpt.resume(tmp_path, "auto", model=model, optimizer=opt, config={"model": "tiny", "label_names": ["bad", "good"]})


def test_another_model_is_reported_as_such(tmp_path):
    model, opt, _ = trained()
    save(tmp_path, 10, model, opt, config={"model": "tiny"})
    other = torch.nn.Linear(4, 2)
    with pytest.raises(CoreCPUError, match="does not fit this model .*model tiny"):
        ckpt.resume(tmp_path, "auto", model=other, optimizer=torch.optim.AdamW(other.parameters()))


def test_changed_settings_and_resolved_choices_are_noted(tmp_path):
    model, opt, _ = trained()
    saved = {"lr": 1e-4, "model": "tiny", "log_every": 1, "resolved": {"precision": "bf16", "threads": 2}}
    save(tmp_path, 5, model, opt, config=saved)
    now = {"lr": 3e-4, "model": "tiny", "log_every": 50, "resolved": {"precision": "fp32", "threads": 2}}
    loop = ckpt.resume(tmp_path, "auto", model=model, optimizer=opt, config=now)
    assert loop.notes == ["resuming with changed settings: lr: 0.0001 -> 0.0003; "
                          "precision resolved to 'bf16' when saved, 'fp32' here"]


def test_missing_scheduler_state_is_noted(tmp_path):
    model, opt, sched = trained()
    save(tmp_path, 5, model, opt)  # saved without a scheduler
    loop = ckpt.resume(tmp_path, "auto", model=model, optimizer=opt, scheduler=sched)
    assert any("no scheduler state" in n for n in loop.notes)


# ---------------------------------------------------------------- leftovers


def test_writer_gone_decision():
    here = "node1"
    dead, live = (lambda pid: False), (lambda pid: True)
    same = lambda pid: "100"  # noqa: E731
    assert store.writer_gone({"host": here, "pid": 5, "start": "100"}, 5, here, dead, same)
    assert not store.writer_gone({"host": here, "pid": 5, "start": "100"}, 5, here, live, same)
    assert store.writer_gone({"host": here, "pid": 5, "start": "100"}, 5, here, live, lambda pid: "999")  # PID reused
    assert not store.writer_gone({"host": "node2", "pid": 5}, 5, here, dead, same)  # cannot check another host
    assert store.writer_gone(None, 5, here, dead, same)  # older saves wrote no owner file
    assert not store.writer_gone(None, None, here, dead, same)


def test_stale_leftovers_are_cleaned_only_when_their_writer_is_gone(tmp_path):
    root = tmp_path / "checkpoints"
    dead = subprocess.Popen(["true"])
    dead.wait()
    gone = root / f".step-00000050.tmp-{dead.pid}"
    running = root / f".step-00000060.tmp-{os.getpid()}"
    remote = root / ".step-00000070.tmp-1"
    partial = root / "step-00000040"  # an interrupted prune: files gone, directory left
    for d in (gone, running, remote, partial):
        d.mkdir(parents=True)
    (gone / "state.pt").write_bytes(b"x" * 1000)
    (running / "owner.json").write_text(json.dumps({"host": "me", "pid": os.getpid(),
                                                    "start": store.process_start(os.getpid())}))
    (remote / "owner.json").write_text(json.dumps({"host": "elsewhere", "pid": 1}))
    notes = store.clean_stale(tmp_path, host="me")
    assert not gone.exists() and not partial.exists()
    assert running.exists() and remote.exists()
    assert len(notes) == 2 and any(str(gone) in n and "did not finish" in n for n in notes)


def test_save_cleans_leftovers_and_same_step_twice_keeps_one(tmp_path):
    model, opt, _ = trained()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / "checkpoints" / f".step-00000005.tmp-{dead.pid}").mkdir(parents=True)
    save(tmp_path, 5, model, opt)
    save(tmp_path, 5, model, opt)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-00000005"]


# ---------------------------------------------------------------- disk full


def test_free_space_is_checked_before_writing(tmp_path, monkeypatch):
    model, opt, _ = trained()
    first = save(tmp_path, 1, model, opt)
    before = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    monkeypatch.setattr(ckpt.shutil, "disk_usage", lambda p: Usage(10**9, 10**9 - 100_000, 100_000))
    with pytest.raises(CoreCPUError, match=r"^no space left on .*checkpoints: checkpoint needs about [\d.]+ MB, "
                                           r"0.10 MB free"):
        save(tmp_path, 2, model, opt)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == before
    assert store.verify(first, json.loads((first / "meta.json").read_text())) is None


def test_enospc_during_the_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model, opt, _ = trained()
    first = save(tmp_path, 1, model, opt)
    real_save = torch.save

    def full(obj, f, *a, **k):
        real_save(obj, f, *a, **k)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt.torch, "save", full)
    with pytest.raises(CoreCPUError, match=r"^no space left on .*: checkpoint needs about"):
        save(tmp_path, 2, model, opt)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == [first.name]
    monkeypatch.setattr(ckpt.torch, "save", real_save)
    assert ckpt.resume(tmp_path, "auto", model=model, optimizer=opt).step == 1


def test_a_failure_writing_meta_json_leaves_neither_the_checkpoint_nor_its_temporary_directory(tmp_path, monkeypatch):
    model, opt, _ = trained()
    first = save(tmp_path, 1, model, opt)

    def no_meta(tmp, meta, files):  # noqa: ANN001, ANN202
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(ckpt, "finish", no_meta)
    with pytest.raises(OSError, match="Input/output error"):
        save(tmp_path, 2, model, opt)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == [first.name]


def test_other_write_errors_are_not_called_disk_full(tmp_path, monkeypatch):
    model, opt, _ = trained()

    def broken(obj, f, *a, **k):
        raise RuntimeError("some other failure")

    monkeypatch.setattr(ckpt.torch, "save", broken)
    with pytest.raises(RuntimeError, match="some other failure"):
        save(tmp_path, 2, model, opt)
    assert list((tmp_path / "checkpoints").iterdir()) == []


@pytest.fixture
def small_tmpfs(tmp_path):
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here to fill a disk for real: {proc.stderr.strip() or proc.returncode}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_real_disk_full_on_a_small_tmpfs(small_tmpfs, monkeypatch):
    # 2 x 1000 x 256 fp32 = ~1 MB of weights, plus AdamW's two moments: ~3 MB, so the second save on a 2 MB tmpfs
    # cannot fit. The space check is skipped to reach the write itself.
    model = torch.nn.Linear(1000, 256)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 1000)).sum().backward()
    opt.step()
    small = torch.nn.Linear(10, 2)
    small_opt = torch.optim.AdamW(small.parameters())
    first = save(small_tmpfs, 1, small, small_opt)
    monkeypatch.setattr(ckpt, "space_problem", lambda *a: None)
    with pytest.raises(CoreCPUError, match=r"^no space left on .*: checkpoint needs about 3 MB, [\d.]+ MB free"):
        save(small_tmpfs, 2, model, opt)
    assert [p.name for p in (small_tmpfs / "checkpoints").iterdir()] == [first.name]
    assert ckpt.resume(small_tmpfs, "auto", model=small, optimizer=small_opt).step == 1
    monkeypatch.undo()
    with pytest.raises(CoreCPUError, match=r"^no space left on .*: checkpoint needs about 3 MB"):
        save(small_tmpfs, 3, model, opt)  # and the estimate catches it before writing anything
    assert [p.name for p in (small_tmpfs / "checkpoints").iterdir()] == [first.name]


class _Payload:
    def __reduce__(self):
        return (print, ("this ran while loading",))


def test_a_pickle_payload_is_refused_without_suggesting_weights_only_false(tmp_path, capsys):
    import pickle

    from corecpu.training.checkpoint_disk import DIGEST, META, file_digest

    model, opt, _ = trained()
    path = save(tmp_path, 1, model, opt)
    with open(path / "state.pt", "wb") as fh:
        pickle.dump({"model": _Payload()}, fh)
    meta = json.loads((path / META).read_text())  # as if the attacker also rewrote the checksums
    meta["files"]["state.pt"] = {"bytes": (path / "state.pt").stat().st_size, DIGEST: file_digest(path / "state.pt")}
    (path / META).write_text(json.dumps(meta))
    with pytest.raises(CoreCPUError) as err:
        ckpt.resume(tmp_path, "auto", model=model, optimizer=opt)
    message = str(err.value)
    assert "holds Python objects besides tensors" in message and "does not load it" in message
    assert "weights_only=False" not in message and "same output directory" not in message
    assert "this ran while loading" not in capsys.readouterr().out


def _half_frozen(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A base (frozen, tied in two places, as a LoRA run's) with a trained head."""
    torch.manual_seed(0)  # the same base whatever the seed
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    model.tied = model[0]  # the same module under a second name: its tensors appear twice in state_dict()
    for p in (*model[0].parameters(), *model[1].parameters()):
        p.requires_grad_(False)
    torch.manual_seed(seed)
    torch.nn.init.normal_(model[2].weight)
    return model, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)


def test_frozen_weights_are_left_out_and_checked_on_resume(tmp_path):
    model, opt = _half_frozen()
    path = save(tmp_path, 1, model, opt)
    state = torch.load(path / "state.pt", weights_only=True)
    assert set(state["model"]) == {"2.weight", "2.bias"}  # no base, under either of its names
    assert json.loads((path / "meta.json").read_text())["frozen"]["omitted"] == 6

    fresh, fresh_opt = _half_frozen(seed=1)
    ckpt.resume(tmp_path, "auto", model=fresh, optimizer=fresh_opt)
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values()):
        assert torch.equal(a, b)

    other, other_opt = _half_frozen()
    with torch.no_grad():
        other[0].weight.add_(1.0)  # another base model
    with pytest.raises(CoreCPUError) as err:
        ckpt.resume(tmp_path, path, model=other, optimizer=other_opt)
    assert "base model changed" in str(err.value) and "\n" not in str(err.value)
    unfrozen, unfrozen_opt = _half_frozen()
    unfrozen[1].weight.requires_grad_(True)  # other LoRA settings: a tensor the checkpoint does not hold
    with pytest.raises(CoreCPUError, match="does not fit this model"):
        ckpt.resume(tmp_path, path, model=unfrozen, optimizer=unfrozen_opt)
