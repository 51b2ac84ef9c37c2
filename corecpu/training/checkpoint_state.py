"""What a checkpoint holds and how every rank saves and resumes it: save() and resume(), symmetric, for any
module and optimizer (the files on disk: checkpoint_disk.py; when to save: checkpointer.py).

    path = checkpoint_state.save(out, step=step, model=model, optimizer=opt, scheduler=sched, epoch=e,
                           batches_in_epoch=b, config=cfg, keep=2)          # every rank calls it
    loop = checkpoint_state.resume(out, "auto", model=model, optimizer=opt, scheduler=sched, config=cfg)
    for note in loop.notes if loop else []: print(note)                    # skipped checkpoints, changes

Rank 0 writes OUTPUT_DIR/checkpoints/step-N/{state.pt, meta.json} atomically, with each file's
size and digest in meta.json (checkpoint_disk.py: the disk side); with a large optimizer state the other
ranks on its host write parts of it beside (optimizer-R.pt, checkpoint_shards.py). resume() verifies them and
falls back to the newest checkpoint that verifies, saying which one it skipped and why. Every
rank's RNG state is stored, because dropout draws differ per rank and an exact resume must
restore each one.
"""

from __future__ import annotations

import contextlib
import json
import math
import pickle
import random
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from corecpu.training import checkpoint_shards as shards
from corecpu.training.checkpoint_disk import (  # noqa: F401  (list_checkpoints: re-exported for callers)
    PREFIX, STATE, Candidate, checkpoint_root, choose, clean_stale, disk_full, finish, list_checkpoints, no_space,
    prune, read_meta, scan, space_problem, verify, write_file, writing)
from corecpu.compute.wrappers import unwrap
from corecpu.distributed.process_group import gather_objects
from corecpu.errors import CoreCPUError

FORMAT = 3  # 1: no file digests, extra keys at the top level of meta.json; 2: state.pt alone

# Settings that change the math of the run; anything else (logging, paths) may differ on resume.
# The settings of a loop's `config` compared on resume when the caller names none (train.py names its own:
# TrainConfig.run_defining(), from the fields marked where they are declared, task options included).
RUN_DEFINING = ("task", "model", "data", "eval_data", "batch_size", "grad_accum", "lr", "weight_decay",
                "warmup_ratio", "max_grad_norm", "epochs", "max_steps", "seed", "max_seq_len", "precision",
                "allreduce_dtype", "dropout")
# What "auto" settings resolved to on the host that saved (config["resolved"]); may differ on another host.
RESOLVED = ("precision", "backend", "allreduce", "threads", "attention", "dropout")


@dataclass
class LoopState:
    """Where the loop is, and what resume() has to say about how it got there."""

    step: int = 0
    epoch: int = 0
    batches_in_epoch: int = 0  # micro-batches of `epoch` already consumed
    extra: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None  # the checkpoint this state came from
    notes: list[str] = field(default_factory=list)  # one line each: skipped checkpoints, changed settings


# ---------------------------------------------------------------- RNG


def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        # weights_only loading refuses numpy arrays; keep the key as a tensor.
        "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_tuples(state["python"]))
    name, key, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, key.numpy().astype(np.uint32), pos, has_gauss, cached))


def _tuples(x: Any) -> Any:
    # random.setstate wants tuples; serialisation may hand back lists.
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


# ---------------------------------------------------------------- save


def save(
    output_dir: str | Path,
    *,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any = None,
    epoch: int = 0,
    batches_in_epoch: int = 0,
    extra: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    keep: int = 2,
    keep_also: Sequence[str] = (),
) -> Path | None:
    """Collective: every rank calls it (every rank's RNG state is gathered). Rank 0 writes the checkpoint, and
    with a large optimizer state the other ranks on its host write parts of it (checkpoint_shards: DDP's ranks
    hold the same state). For the 135M-parameter model's full fine-tuning (1.6 GB) on the 2-vCPU EPYC, 2 ranks:
    1.5 s, against 3.2 s for rank 0 alone and 6.2 s for the Trainer's files (benchmarks/checkpoint_write.py).
    `keep_also`: step-* names kept beside the newest `keep` (the best evaluation's, --keep-best).

    Returns the checkpoint directory on rank 0, None elsewhere. A failure (disk full) raises
    CoreCPUError on every rank, and the previous checkpoints are left as they were.
    `extra` and `config` must be JSON-serialisable; `config["label_names"]` and
    `config["resolved"]` (precision, backend, allreduce, threads) are compared on resume.
    """
    rank = dist.get_rank() if dist.is_initialized() else 0
    host = socket.gethostname()
    gathered = gather_objects((host, rng_state()))
    final = checkpoint_root(output_dir) / f"{PREFIX}{step:08d}"
    parts = _parts(kept_weights(unwrap(model)), optimizer, scheduler, [s for _, s in gathered],
                   shards.writer_ranks([h for h, _ in gathered]))
    unexpected: list[BaseException] = []

    def attempt(work: Callable[[], Any]) -> tuple[Any, str | None]:
        # (the result, None) or (None, the one line every rank will raise). An exception we do not know is
        # kept, and raised on this rank once the others were told, so that this rank shows its traceback.
        try:
            return work(), None
        except CoreCPUError as exc:
            return None, str(exc)
        except Exception as exc:
            if disk_full(exc):
                return None, f"no space left on {final.parent} to finish checkpoint {final.name}; free some space " \
                             "or write checkpoints to another output directory"
            unexpected.append(exc)
            return None, f"rank {rank} could not write checkpoint {final} ({type(exc).__name__}: {exc}); see " \
                         f"rank {rank}'s error"

    def stop_on(errors: Sequence[str | None]) -> None:
        first = next((e for e in errors if e), None)
        if first is not None:
            raise unexpected[0] if unexpected else CoreCPUError(first)

    with contextlib.ExitStack() as stack:  # rank 0's temporary directory: removed if anything below raises
        meta, tmp, error = {}, None, None
        if rank == 0:
            meta = {"format": FORMAT, "step": step, "epoch": epoch, "batches_in_epoch": batches_in_epoch,
                    "world_size": len(gathered), "saved_at": time.time(), "host": host, "config": config or {},
                    "extra": extra or {}}
            tmp, error = attempt(lambda: _prepare(stack, output_dir, final, host, model, meta, parts))
        where, error = _broadcast((str(tmp) if tmp else None, error))
        stop_on([error])
        mine = parts.get(rank)
        written, error = attempt(lambda: _write_part(Path(where), *mine)) if mine else (None, None)
        outcomes = gather_objects((written, error))
        stop_on([e for _, e in outcomes])
        if rank == 0:
            _, error = attempt(lambda: _commit(stack, tmp, meta, [w for w, _ in outcomes if w], output_dir, keep,
                                               keep_also))
    stop_on([_broadcast(error if rank == 0 else None)])
    return final if rank == 0 else None


def _parts(weights: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer | None, scheduler: Any,
           states: list[Any], writers: list[int]) -> dict[int, tuple[str, dict[str, Any]]]:
    """{rank: (file name, what it holds)} for the ranks that write a file of this checkpoint (the same on every
    rank: planned from sizes alone)."""
    main: dict[str, Any] = {"model": weights, "rng": states}
    if scheduler is not None:
        main["scheduler"] = scheduler.state_dict()
    if optimizer is None:
        return {0: (STATE, main)}
    opt = optimizer.state_dict()
    sizes = {k: shards.tensor_bytes(v) for k, v in opt["state"].items()}
    if len(writers) == 1 or sum(sizes.values()) < shards.SHARD_MIN_BYTES:
        return {0: (STATE, {**main, "optimizer": opt})}
    cut = shards.split(opt, shards.plan(sizes, len(writers), head_start=shards.tensor_bytes(weights)))
    parts = {0: (STATE, {**main, "optimizer": cut[0]})}
    parts.update({r: (shards.SHARD_NAME.format(rank=r), part) for r, part in zip(writers[1:], cut[1:])})
    return parts


def _prepare(stack: contextlib.ExitStack, output_dir: str | Path, final: Path, host: str, model: torch.nn.Module,
             meta: dict[str, Any], parts: dict[int, tuple[str, dict[str, Any]]]) -> Path:
    """Rank 0: the checks that need no writing, then the temporary directory every writer writes into."""
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    clean_stale(output_dir, host=host)
    frozen = frozen_record(unwrap(model))
    if frozen:
        meta["frozen"] = frozen
    try:
        json.dumps(meta)
    except TypeError as exc:
        raise CoreCPUError(f"checkpoint extra/config must be JSON-serialisable ({exc}); pass plain numbers, "
                           "strings, lists and dicts") from None
    need = sum(shards.tensor_bytes(part) for _, part in parts.values())
    problem = space_problem(need, shutil.disk_usage(root).free, root)
    if problem:
        raise CoreCPUError(problem)
    return stack.enter_context(writing(final, host))


def _write_part(tmp: Path, name: str, obj: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    try:
        return name, write_file(tmp / name, obj)
    except (OSError, RuntimeError) as exc:
        if not disk_full(exc):
            raise
        raise CoreCPUError(no_space(tmp.parent, shards.tensor_bytes(obj), shutil.disk_usage(tmp.parent).free)) from None


def _commit(stack: contextlib.ExitStack, tmp: Path, meta: dict[str, Any], written: list[tuple[str, Any]],
            output_dir: str | Path, keep: int, keep_also: Sequence[str]) -> None:
    """Rank 0, once every part is written: meta.json, the rename into place, then pruning."""
    try:
        finish(tmp, meta, dict(written))
    except BaseException as exc:
        stack.__exit__(type(exc), exc, exc.__traceback__)  # the temporary directory goes, never into place
        raise
    stack.close()  # the rename: the checkpoint exists from here
    prune(output_dir, keep, keep_also)


def kept_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a checkpoint keeps of the model: its state without the frozen parameters (a LoRA run's base, which
    the run reloads from --model: saving it at every checkpoint would write the whole base for a few MB of
    adapters)."""
    frozen = _frozen_names(module)
    return {k: v for k, v in module.state_dict().items() if k not in frozen}


def frozen_record(module: torch.nn.Module) -> dict[str, Any] | None:
    """For meta.json, when kept_weights() left frozen parameters out: how to know them again (their count and
    checksum)."""
    frozen = _frozen_names(module)
    return {"omitted": len(frozen), "checksum": _frozen_checksum(module)} if frozen else None


def load_model_state(model: torch.nn.Module, weights: dict[str, torch.Tensor], frozen: dict[str, Any] | None,
                     path: Path) -> None:
    """Load what kept_weights() kept. Frozen parameters left out must be exactly this model's frozen ones and
    hold the weights the checkpoint trained on (one line otherwise: a changed base model is not this run)."""
    module = unwrap(model)
    if not frozen:
        module.load_state_dict(weights)
        return
    result = module.load_state_dict(weights, strict=False)
    if result.unexpected_keys or set(result.missing_keys) != _frozen_names(module):
        missing = sorted(set(result.missing_keys) - _frozen_names(module)) or result.unexpected_keys
        raise CoreCPUError(f"checkpoint {path} does not fit this model ({len(missing)} tensors do not match, e.g. "
                           f"{missing[0]}); resume with the same model and LoRA settings, or start fresh in another "
                           "output directory")
    # Not bit-equality: a float64 sum's last bits depend on the thread count that reduced it.
    if not math.isclose(_frozen_checksum(module), frozen["checksum"], rel_tol=1e-9, abs_tol=1e-6):
        raise CoreCPUError(f"checkpoint {path} trained adapters on other frozen base weights than --model's now "
                           "(their checksums differ): the base model changed; resume with the model it was "
                           "trained on, or start fresh in another output directory")


def _frozen_names(module: torch.nn.Module) -> set[str]:
    # Every name a frozen tensor has in state_dict(): tied weights appear under each of their names.
    return {n for n, p in module.named_parameters(remove_duplicate=False) if not p.requires_grad}


def _frozen_checksum(module: torch.nn.Module) -> float:
    with torch.no_grad():
        return float(sum(p.double().sum() for p in module.parameters() if not p.requires_grad))


def _broadcast(obj: Any) -> Any:
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# ---------------------------------------------------------------- resume


def config_changes(saved: dict[str, Any], config: dict[str, Any], compare: Sequence[str] = RUN_DEFINING) -> list[str]:
    """'name: saved -> now' for each run-defining setting (`compare`), and each resolved choice, that differs."""
    changes = [f"{k}: {saved[k]!r} -> {config[k]!r}" for k in compare
               if k in saved and k in config and saved[k] != config[k]]
    was, now = saved.get("resolved") or {}, config.get("resolved") or {}
    changes += [f"{k} resolved to {was[k]!r} when saved, {now[k]!r} here" for k in RESOLVED
                if k in was and k in now and was[k] != now[k]]
    return changes


def _layout(config: dict[str, Any], world: int) -> tuple[int, int, int] | None:
    try:
        return int(config["batch_size"]), world, int(config["grad_accum"])
    except (KeyError, TypeError, ValueError):
        return None  # a library user's config without them: nothing to compare


def layout_change(saved: dict[str, Any], saved_world: int, config: dict[str, Any], world: int) -> str | None:
    """What changed in examples per micro-batch (batch x ranks) or micro-batches per step, or None.

    The saved position counts micro-batches per rank; it names the same examples only when every
    micro-batch spans as many examples over all ranks as before (2 ranks x 8 -> 1 rank x 16 does),
    and steps hold as many micro-batches."""
    was, now = _layout(saved, saved_world), _layout(config, world)
    if was is None or now is None or (was[0] * was[1], was[2]) == (now[0] * now[1], now[2]):
        return None
    return (f"it was saved by {was[1]} rank(s) x batch {was[0]} x --grad-accum {was[2]} and this run is {now[1]} "
            f"rank(s) x batch {now[0]} x --grad-accum {now[2]}")


def approximate_position(saved: dict[str, Any], saved_world: int, config: dict[str, Any], world: int,
                         batches: int) -> str:
    """How far the approximate resume position is from where the checkpoint stopped, in examples."""
    was, now = _layout(saved, saved_world), _layout(config, world)
    assert was is not None and now is not None
    seen, skip = batches * was[0] * was[1], batches * now[0] * now[1]
    if skip == seen:
        return "the same number of examples of this epoch is skipped"
    what = "skipped without being trained on" if skip > seen else "trained on a second time"
    return f"the checkpoint had used {seen} examples of its epoch; this run starts after {skip}, so about " \
           f"{abs(skip - seen)} are {what}"


def label_problem(saved: dict[str, Any], config: dict[str, Any]) -> str | None:
    """Why the checkpoint's head cannot fit this run's model, or None: another task or other labels."""
    task_was, task_now = saved.get("task", "classification"), config.get("task", "classification")
    if task_was != task_now:
        return f"it was trained for --task {task_was} and this run is --task {task_now}"
    was, now = saved.get("label_names"), config.get("label_names")
    if was is None or now is None or list(was) == list(now):
        return None
    return f"it was trained with labels {list(was)} and this run has {list(now)}"


def resume(
    output_dir: str | Path,
    which: str = "auto",
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any = None,
    config: dict[str, Any] | None = None,
    compare: Sequence[str] = RUN_DEFINING,
) -> LoopState | None:
    """Restore model, optimizer, scheduler and this rank's RNG in place; None means a fresh start.
    `compare`: the settings of `config` whose change since the checkpoint the notes name.

    `which`: "" (fresh start), "auto" (the newest checkpoint under output_dir that verifies; a
    fresh start if there is none yet) or a checkpoint directory. Collective when torch.distributed
    is initialised: rank 0 picks and verifies, every rank loads the same one. The returned
    LoopState's `notes` say which checkpoints were skipped and why, and what changed since.
    """
    if not which:
        return None
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    config = config or {}
    choice: tuple[str | None, list[str], str | None] = (None, [], None)
    if rank == 0:
        try:
            choice = _choose_rank0(output_dir, which, config)
        except CoreCPUError as exc:
            choice = (None, [], str(exc))
    path_s, notes, error = _broadcast(choice)
    if error:
        raise CoreCPUError(error)
    if path_s is None:
        return None
    path = Path(path_s)
    try:
        loop, saved_config = _load(path, model, optimizer, scheduler, rank, world)
        error = None
    except CoreCPUError as exc:
        error = str(exc)
    errors = [e for e in gather_objects(error) if e]  # every rank stops if any one could not load
    if errors:
        raise CoreCPUError(errors[0])
    loop.notes = notes + loop.notes
    saved_world = int((read_meta(path)[0] or {}).get("world_size", world))
    moved = layout_change(saved_config, saved_world, config, world)
    if moved and not config.get("resume_approximate"):
        raise CoreCPUError(f"cannot resume exactly from {path}: {moved}, so the position in epoch {loop.epoch + 1} "
                           "would skip or repeat examples; resume with the same ranks x batch size x --grad-accum, "
                           "or pass --resume-approximate to accept that")
    if moved:
        where = approximate_position(saved_config, saved_world, config, world, loop.batches_in_epoch)
        loop.notes.append(f"resuming approximately ({moved}): {where}")
    changes = config_changes(saved_config, config, compare)
    if changes:
        loop.notes.append(f"resuming with changed settings: {'; '.join(changes)}")
    return loop


def _choose_rank0(output_dir: str | Path, which: str, config: dict[str, Any]) -> tuple[str | None, list[str], None]:
    notes = clean_stale(output_dir)

    def check(c: Candidate) -> str | None:
        assert c.meta is not None
        return verify(c.path, c.meta) or _label_or_none(c.meta, config)

    if which == "auto":
        candidates = scan(output_dir)
        chosen, skipped = choose(candidates, check)
        if chosen is None and candidates:
            raise CoreCPUError(f"no checkpoint in {checkpoint_root(output_dir)} can be resumed ("
                               + "; ".join(n.removeprefix("skipped checkpoint ") for n in skipped)
                               + "); remove them to start fresh, or pass a checkpoint directory to resume from")
        return (str(chosen.path) if chosen else None), notes + skipped, None
    path = Path(which)
    meta, problem = read_meta(path) if path.is_dir() else (None, "not a directory")
    problem = problem or verify(path, meta) or _label_or_none(meta, config)
    if problem:
        raise CoreCPUError(f"cannot resume from {which}: {problem}; pass another checkpoints/step-* directory "
                           "or 'auto' for the newest one that verifies")
    return str(path), notes, None


def _label_or_none(meta: dict[str, Any], config: dict[str, Any]) -> str | None:
    problem = label_problem(meta.get("config") or {}, config)
    if problem is None:
        return None
    raise CoreCPUError(f"checkpoint {meta.get('step')} does not fit this run's model head: {problem}; use the same "
                       "task and label set (same data and label column), or start fresh in another output directory")


def _load(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, scheduler: Any,
          rank: int, world: int) -> tuple[LoopState, dict[str, Any]]:
    meta, problem = read_meta(path)
    if meta is None:
        raise CoreCPUError(f"cannot resume from {path}: {problem}")
    state = _read_state(path, meta, f" on rank {rank}", "every rank needs the same output directory")
    try:
        load_model_state(model, state["model"], meta.get("frozen"), path)
        if optimizer is not None and "optimizer" in state:
            optimizer.load_state_dict(state["optimizer"])
    except (RuntimeError, ValueError, KeyError) as exc:
        was = (meta.get("config") or {}).get("model", "?")
        raise CoreCPUError(f"checkpoint {path} does not fit this model (it was written for model {was}: "
                           f"{_first_line(exc)}); resume with the same model, or start fresh in another output "
                           "directory") from None
    notes = []
    if scheduler is not None:
        if "scheduler" in state:
            scheduler.load_state_dict(state["scheduler"])
        else:
            notes.append(f"checkpoint {path} has no scheduler state: the schedule restarts from its beginning")
    rngs = state["rng"]
    if len(rngs) == world:
        set_rng_state(rngs[rank])
    else:
        notes.append(f"checkpoint was written by {len(rngs)} ranks and this run has {world}: "
                     "data order and RNG streams will differ from an uninterrupted run")
    extra = dict(meta.get("extra") or {}) if meta.get("format", 1) >= 2 else {
        k: v for k, v in meta.items() if k not in ("step", "epoch", "batches_in_epoch", "world_size", "saved_at", "config")}
    loop = LoopState(meta["step"], meta.get("epoch", 0), meta.get("batches_in_epoch", 0), extra, path, notes)
    return loop, meta.get("config") or {}


def _read_state(path: Path, meta: dict[str, Any], where: str, fix: str) -> dict[str, Any]:
    """state.pt, with the optimizer state other ranks wrote (optimizer-R.pt: checkpoint_shards) put back in."""
    state = _load_file(path / STATE, where, fix)
    others = sorted(name for name in meta.get("files") or {} if name != STATE)
    if others:
        parts = [_load_file(path / name, where, fix) for name in others]
        state["optimizer"] = shards.merge(state["optimizer"], parts)
    return state


def _load_file(file: Path, where: str, fix: str) -> dict[str, Any]:
    """Tensors only (weights_only): a pickle that would run code is refused, never loaded."""
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:
        if isinstance(exc, pickle.UnpicklingError) or "weights_only" in str(exc):
            # torch's own advice here is to load with weights_only=False, i.e. to run the file's code: never.
            raise CoreCPUError(f"checkpoint {file} holds Python objects besides tensors (a pickle that could "
                               "run code when loaded), so corecpu does not load it; resume from another checkpoint "
                               "or start fresh") from None
        # A file rank 0 verified but this rank cannot read: another filesystem view.
        raise CoreCPUError(f"cannot read {file}{where} ({_first_line(exc)}); {fix}") from None


def read_checkpoint(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(meta.json, state.pt) of one checkpoint directory, verified against its recorded sizes and digests.
    No process group and no model: what `corecpu export` reads. One CoreCPUError line for a bad one."""
    path = Path(path)
    meta, problem = read_meta(path) if path.is_dir() else (None, "not a directory")
    problem = problem or verify(path, meta)  # type: ignore[arg-type]  (meta is set when problem is None)
    if problem:
        raise CoreCPUError(f"cannot read checkpoint {path}: {problem}; pass another checkpoints/step-* directory")
    return meta, _read_state(path, meta, "", "check the file system it is on")  # type: ignore[return-value]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

