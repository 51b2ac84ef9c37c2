"""Tokenize once per host: local rank 0 tokenizes and caches, the other local ranks load the cache.

The cache file is named by a hash of the examples, the tokenizer (its full serialized
form, not its path) and max_seq_len, so a change to any of them is a miss, never a
stale hit. Files are written atomically (corecpu.atomic), so hosts sharing a filesystem,
or a crash mid-write, cannot leave a torn file. If the cache cannot be written or read,
each rank tokenizes for itself: slower, never wrong.

    train_set = tokenize_cached(train_data, tokenizer, cfg.max_seq_len, Path(cfg.output_dir) / "cache",
                                local_rank=ctx.info.local_rank)
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Callable, TypeVar

import torch

from corecpu import atomic, envvars, notices
from corecpu.data.tokenized import TokenizedDataset
from corecpu.data.types import ClassificationData
from corecpu.distributed.process_group import barrier
from corecpu.errors import os_problem

FORMAT_VERSION = 2  # 2: a digest of the contents, checked on every read
T = TypeVar("T")


def data_fingerprint(data: ClassificationData) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps(data.label_names).encode())
    for i, text in enumerate(data.texts):
        pair = data.text_pairs[i] if data.text_pairs is not None else ""
        h.update(f"{len(text)}:{text}\x1f{len(pair)}:{pair}\x1f{data.labels[i]}\x1e".encode())
    h.update(b"pairs" if data.text_pairs is not None else b"single")
    return h.hexdigest()


def tokenizer_fingerprint(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        text = backend.to_str()  # vocabulary, normalizer, pre-tokenizer, post-processor: all that decides ids
    else:
        text = json.dumps(sorted(tokenizer.get_vocab().items())) + json.dumps(tokenizer.special_tokens_map, default=str)
    extra = f"{type(tokenizer).__name__}|{getattr(tokenizer, 'truncation_side', 'right')}"
    return hashlib.blake2b((text + extra).encode(), digest_size=16).hexdigest()


def cache_path(cache_dir: Path, data: ClassificationData, tokenizer: Any, max_seq_len: int) -> Path:
    key = hashlib.blake2b(f"{FORMAT_VERSION}|{data_fingerprint(data)}|{tokenizer_fingerprint(tokenizer)}|"
                          f"{max_seq_len}".encode(), digest_size=12).hexdigest()
    return cache_dir / f"tokenized-{key}.pt"


class CachedTokenizedDataset(TokenizedDataset):
    """A TokenizedDataset rebuilt from a cache file instead of by tokenizing."""

    def __init__(self, state: dict[str, Any], tokenizer: Any, max_seq_len: int) -> None:  # noqa: D107 - no super()
        lengths = state["lengths"].tolist()
        self.input_ids = [t.tolist() for t in state["input_ids"].split(lengths)]
        types = state["token_type_ids"]
        self.token_type_ids = None if types is None else [t.tolist() for t in types.split(lengths)]
        self.labels = list(state["labels"])
        self.label_names = list(state["label_names"])
        self.tokenizer = tokenizer
        self.max_seq_len = max_seq_len  # part of the cache key: the same as when it was written
        self.num_at_max_len = int(state["num_at_max_len"])


def flat_tensor(rows: list[list[int]]) -> torch.Tensor:
    """Ragged int rows as one int32 tensor; split it again by the rows' lengths."""
    return torch.tensor([x for r in rows for x in r], dtype=torch.int32)


def _state(ds: TokenizedDataset) -> dict[str, Any]:
    flat = flat_tensor
    return {"lengths": torch.tensor([len(r) for r in ds.input_ids], dtype=torch.int64),
            "input_ids": flat(ds.input_ids), "token_type_ids": None if ds.token_type_ids is None else flat(ds.token_type_ids),
            "labels": list(ds.labels), "label_names": list(ds.label_names), "num_at_max_len": ds.num_at_max_len}


def _write(path: Path, state: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic.replacing(path) as tmp:
        torch.save(state, tmp)


def state_digest(state: dict[str, Any]) -> str:
    """SHA-256 of every value in the state (tensor bytes, other values as JSON), in key order: a file whose
    token ids changed while it still unpickles (bit rot, a bad copy) no longer matches the digest."""
    h = hashlib.sha256()
    for key in sorted(k for k in state if k != "digest"):
        value = state[key]
        h.update(key.encode())
        if isinstance(value, torch.Tensor):
            h.update(str((value.dtype, tuple(value.shape))).encode())
            h.update(value.contiguous().numpy().tobytes())
        else:
            h.update(json.dumps(value, sort_keys=True, default=str).encode())
    return h.hexdigest()


def _read(path: Path, restore: Callable[[dict[str, Any]], T]) -> T | None:
    try:
        state = torch.load(path, weights_only=True)
    except Exception:  # noqa: BLE001 - a torn pickle fails in many ways; any of them means tokenize instead
        return None
    if state.get("version") != FORMAT_VERSION:
        return None
    if state.get("digest") != state_digest(state):
        print(f"note: the tokenization cache {path} does not match its checksum (a damaged file); tokenizing again",
              file=sys.stderr, flush=True)
        return None
    try:
        return restore(state)
    except Exception:  # noqa: BLE001 - a state of another shape: rebuild
        return None


def cached_per_host(path: Path | None, build: Callable[[], T], state_of: Callable[[T], dict[str, Any]],
                    restore: Callable[[dict[str, Any]], T], local_rank: int,
                    wait: Callable[[], None] = barrier, what: str = "the data") -> T:
    """`build()`'s result, computed once per host; every rank must call this (it waits for all ranks once).

    Local rank 0 of each host reads `path` or builds and writes it (the tensors of `state_of`);
    after `wait` the other local ranks `restore` what it wrote. path None: build, no cache.
    The job's first rank says which it did: "tokenizing `what`..." and its time, or a cache hit.
    """
    if path is None:
        with notices.phase(f"tokenizing {what}"):
            return build()
    result = None
    if local_rank == 0:
        result = _read(path, restore) if path.exists() else None
        if result is not None:
            notices.say(f"tokenized {what}: cache hit ({path})")
        else:
            try:
                with notices.phase(f"tokenizing {what}"):
                    result = build()
            except Exception:
                wait()  # release the other local ranks: they hit the same error building for themselves
                raise
            try:
                state = {"version": FORMAT_VERSION, **state_of(result)}
                _write(path, {**state, "digest": state_digest(state)})
            except OSError as exc:
                notices.warn(f"cannot write the tokenization cache in {path.parent} ({os_problem(exc, path)}); "
                             f"every rank tokenizes for itself (or set {envvars.CACHE_DIR} to a writable directory)",
                             per_host=True)
    wait()
    if result is None:
        result = _read(path, restore)
    return result if result is not None else build()


def tokenize_cached(data: ClassificationData, tokenizer: Any, max_seq_len: int, cache_dir: Path | None,
                    local_rank: int, wait: Callable[[], None] = barrier, kind: str = "") -> TokenizedDataset:
    """The tokenized dataset, once per host (see cached_per_host); cache_dir None: no cache. `kind` ("training",
    "eval"): what the start-up line calls the examples."""
    path = None if cache_dir is None else cache_path(Path(cache_dir), data, tokenizer, max_seq_len)
    return cached_per_host(path, lambda: TokenizedDataset(data, tokenizer, max_seq_len), _state,
                           lambda state: CachedTokenizedDataset(state, tokenizer, max_seq_len), local_rank, wait,
                           what=f"{len(data.texts):,} {kind + ' ' if kind else ''}examples")
