"""Classification data: file loading, the built-in task, tokenization and DDP loaders.

Batches from `make_collate` carry two non-model keys, listed in META_KEYS, that the
training loop must pop before calling the model:
  num_tokens  int, real (non-pad) tokens in the batch, for tokens/s logging;
  valid       BoolTensor (B,), False for filler items that only exist so every rank
              runs the same number of eval batches. Weight per-example metrics by it.
Resume mid-epoch with `set_epoch(loader, epoch, skip_batches=k)`: it slices the
sampler's index list, so skipped batches are never tokenized, collated or loaded.
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from corecpu.errors import CoreCPUError

META_KEYS = ("num_tokens", "valid")
FORMATS = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json-lines": "jsonl"}
# Header conventions (GLUE, HF datasets) tried in order when no columns are given.
DEFAULT_COLUMNS = (("sentence1", "sentence2", "label"), ("text", None, "label"), ("sentence", None, "label"))
COLUMN_FLAGS = "--text-column, --text-pair-column and --label-column (names or 0-based indices)"
Column = str | int | None


@dataclass
class ClassificationData:
    texts: list[str]
    text_pairs: list[str] | None
    labels: list[int]
    label_names: list[str]
    source: str

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def num_labels(self) -> int:
        return len(self.label_names)


# ---------------------------------------------------------------- file loading

def _short(values: Sequence[Any], limit: int = 20) -> str:
    shown = ", ".join(repr(str(v)) for v in values[:limit])
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")


def _records(path: Path, fmt: str) -> Iterator[tuple[int, Any]]:
    """Yield (starting line number, row) for non-blank rows; rows are lists (tsv/csv) or dicts."""
    with path.open(encoding="utf-8-sig", newline="") as fh:
        if fmt == "jsonl":
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise CoreCPUError(f"data file '{path}' line {lineno}: invalid JSON ({exc.msg}); "
                                       "each line of a JSONL file must be one JSON object") from None
                if not isinstance(obj, dict):
                    raise CoreCPUError(f"data file '{path}' line {lineno}: expected a JSON object, found "
                                       f"{type(obj).__name__}; write one object per line, e.g. "
                                       '{"text": "...", "label": "..."}')
                yield lineno, obj
            return
        # GLUE TSVs (MRPC, SST-2) contain bare quote characters: with quoting on, csv would
        # swallow tabs and newlines until the next quote. CSV keeps normal RFC 4180 quoting.
        reader = csv.reader(fh, **({"delimiter": "\t", "quoting": csv.QUOTE_NONE} if fmt == "tsv" else {}))
        prev = 0
        try:
            for row in reader:
                start, prev = prev + 1, reader.line_num  # a quoted CSV record can span lines
                if any(cell.strip() for cell in row):
                    yield start, row
        except csv.Error as exc:
            raise CoreCPUError(f"data file '{path}' line {reader.line_num}: malformed {fmt.upper()} ({exc}); "
                               "fix the row or pass the right --data-format") from None


def _pick(col: Column, header: list[str] | None, jsonl: bool, what: str, path: Path) -> int | str:
    """Resolve a column given by name or 0-based index to a row index (tsv/csv) or key (jsonl)."""
    flag = "--" + what.replace(" ", "-") + "-column"
    if header is not None and col in header:
        return col if jsonl else header.index(col)  # type: ignore[arg-type]
    if jsonl:
        raise CoreCPUError(f"data file '{path}': no {what} key {col!r} in the first line (keys: {_short(header)}); "
                           f"pass {flag} with one of those keys")
    if isinstance(col, int) or str(col).isdigit():
        if header is not None and int(col) >= len(header):  # type: ignore[arg-type]
            raise CoreCPUError(f"data file '{path}': {what} column index {col} is out of range (the file has "
                               f"{len(header)} columns: {_short(header)}); pass {flag} with a valid name or index")
        return int(col)  # type: ignore[arg-type]
    avail = f"available columns: {_short(header)}" if header else "the file has no header, so use 0-based indices"
    raise CoreCPUError(f"data file '{path}': no {what} column named {col!r} ({avail}); pass {flag} NAME_OR_INDEX")


def _infer(keys: list[str], text: Column, pair: Column, label: Column, path: Path) -> tuple[Column, Column, Column]:
    if text is None:
        for t, p, lab in DEFAULT_COLUMNS:
            if t in keys and (p is None or p in keys) and (label is not None or lab in keys):
                return t, (pair if pair is not None else p), (label if label is not None else lab)
        raise CoreCPUError(f"data file '{path}': cannot tell which columns hold the text and label "
                           f"(available columns: {_short(keys)}); pick them with {COLUMN_FLAGS}")
    if label is None and "label" not in keys:
        raise CoreCPUError(f"data file '{path}': no 'label' column (available columns: {_short(keys)}); "
                           "pick it with --label-column NAME_OR_INDEX")
    return text, pair, "label" if label is None else label


def load_file(path: str | Path, *, fmt: str | None = None, text_column: Column = None,
              text_pair_column: Column = None, label_column: Column = None, has_header: bool = True,
              label_names: Sequence[str] | None = None) -> ClassificationData:
    """Load a TSV/CSV/JSONL classification file.

    Pass the training set's `label_names` when loading an eval file so label ids agree;
    labels the training set never had are then an error instead of a silent new class.
    """
    path = Path(path)
    if not path.is_file():
        raise CoreCPUError(f"data file '{path}' not found; pass --data PATH to a TSV, CSV or JSONL file, "
                           "or --data builtin")
    if fmt is None and path.suffix.lower() not in FORMATS:
        raise CoreCPUError(f"data file '{path}': cannot tell the format from extension {path.suffix!r}; "
                           "rename it to .tsv, .csv or .jsonl, or pass --data-format tsv|csv|jsonl")
    fmt = (fmt or FORMATS[path.suffix.lower()]).lower()
    if fmt not in ("tsv", "csv", "jsonl"):
        raise CoreCPUError(f"unknown data format {fmt!r}; pass --data-format tsv, csv or jsonl")
    try:
        texts, pairs, raw = _parse(path, fmt, (text_column, text_pair_column, label_column), has_header)
    except UnicodeDecodeError as exc:
        raise CoreCPUError(f"data file '{path}' is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                           "convert it to UTF-8") from None
    if label_names is None:
        names = sorted({lab for _, lab in raw})
        if all(n.lstrip("-").isdigit() for n in names):  # numeric order: "10" after "9", label i is id i
            names.sort(key=int)
        if len(names) < 2:
            raise CoreCPUError(f"data file '{path}': every example has label {names[0]!r}; classification needs "
                               "at least 2 labels (check --label-column)")
    else:
        names = list(label_names)
    index = {n: i for i, n in enumerate(names)}
    for lineno, lab in raw:
        if lab not in index:
            raise CoreCPUError(f"data file '{path}' line {lineno}: label {lab!r} is not in the training data's "
                               f"labels ({_short(names)}); use an eval file with the same label set")
    return ClassificationData(texts, pairs, [index[lab] for _, lab in raw], names, str(path))


def _parse(path: Path, fmt: str, columns: tuple[Column, Column, Column],
           has_header: bool) -> tuple[list[str], list[str] | None, list[tuple[int, str]]]:
    jsonl = fmt == "jsonl"
    rows = _records(path, fmt)
    first = next(rows, None)
    if first is None:
        raise CoreCPUError(f"data file '{path}' is empty (no examples); add a header line and one example per line"
                           if not jsonl else f"data file '{path}' has no examples; add one JSON object per line")
    header = None
    if jsonl:  # JSONL keys play the header's part
        header, rows = list(first[1]), itertools.chain([first], rows)
    elif has_header:
        header = [h.strip() for h in first[1]]
    else:
        rows = itertools.chain([first], rows)
    if header is not None:
        columns = _infer(header, *columns, path)
    elif columns[0] is None or columns[2] is None:
        raise CoreCPUError(f"data file '{path}' has no header; pick columns by 0-based index with {COLUMN_FLAGS}")
    cols = [None if c is None else _pick(c, header, jsonl, what, path)
            for c, what in zip(columns, ("text", "text pair", "label"))]
    width = None if jsonl else len(header) if header is not None else None
    texts: list[str] = []
    pairs: list[str] | None = [] if cols[1] is not None else None
    raw: list[tuple[int, str]] = []
    for lineno, row in rows:
        where = f"data file '{path}' line {lineno}"
        if jsonl:
            missing = [c for c in cols if c is not None and c not in row]
            if missing:
                raise CoreCPUError(f"{where}: missing key {missing[0]!r} (keys here: {_short(list(row))}); "
                                   "every line needs the text and label keys")
        else:
            width = width or len(row)  # headerless: the first row fixes the width
            if len(row) != width:
                raise CoreCPUError(f"{where}: expected {width} {'tab' if fmt == 'tsv' else 'comma'}-separated "
                                   f"fields like the {'header' if header else 'first row'}, found {len(row)}; "
                                   "fix or remove the row")
            if max(c for c in cols if c is not None) >= width:  # type: ignore[type-var]
                raise CoreCPUError(f"{where}: a column index is out of range (rows have {width} fields); "
                                   f"pick columns with {COLUMN_FLAGS}")
        text, pair, lab = (None if c is None else row[c] for c in cols)
        for name, v in (("text", text), ("text pair", pair if pairs is not None else "-")):
            if not isinstance(v, str):
                raise CoreCPUError(f"{where}: {name} must be a string, found {type(v).__name__}; fix the row")
            if not v.strip():
                raise CoreCPUError(f"{where}: empty {name}; fix or remove the row")
        if isinstance(lab, bool) or not isinstance(lab, (str, int)):
            raise CoreCPUError(f"{where}: label must be a string or integer, found {lab!r}; "
                               "corecpu does classification, not regression")
        if not str(lab).strip():
            raise CoreCPUError(f"{where}: empty label; fix or remove the row")
        texts.append(text)
        if pairs is not None:
            pairs.append(pair)
        raw.append((lineno, str(lab).strip()))
    if not texts:
        raise CoreCPUError(f"data file '{path}' has no examples after the header; add at least one row")
    return texts, pairs, raw


def load_data(spec: str, *, split: str = "train", seed: int = 0, label_names: Sequence[str] | None = None,
              **file_options: Any) -> ClassificationData:
    """`spec` is 'builtin', a file path, or a Hugging Face dataset (corecpu.hf_data); file_options go to
    load_file (fmt, *_column, has_header)."""
    if spec != "builtin":
        from corecpu.hf_data import is_hf_source, load_hf_dataset  # Parquet/Arrow/save_to_disk via datasets

        if is_hf_source(spec):
            return load_hf_dataset(spec, split=split, label_names=label_names, **file_options)
        return load_file(spec, label_names=label_names, **file_options)
    used = [k for k, v in file_options.items() if v not in (None, True)]
    if used:
        flag = "--data-format" if used[0] == "fmt" else "--" + used[0].replace("_", "-")
        raise CoreCPUError(f"{flag} does not apply to --data builtin; drop it or pass --data PATH")
    data = builtin_dataset(split, seed=seed)
    if label_names is not None and list(label_names) != data.label_names:
        raise CoreCPUError(f"the builtin data has labels {data.label_names}, the training data {list(label_names)}; "
                           "use builtin for both --data and the eval data, or neither")
    return data


# ---------------------------------------------------------------- built-in task
# Templated reviews whose label is the sentiment of the *main* clause. Negation flips
# an adjective or verb, a distractor clause of opposite sentiment often sits beside it,
# and some idioms invert their sentiment word, so counting words is not enough.

LABEL_NAMES = ["negative", "positive"]
_ITEMS = tuple(("the blender,this laptop,the coffee maker,the vacuum cleaner,this phone,the keyboard,the backpack,"
                "the tent,the rain jacket,the desk lamp,the router,the mattress,the camera,the speaker,the kettle,"
                "this printer,the smartwatch,the office chair,the movie,the film,this documentary,the sequel,"
                "the season finale,the novel,the album,the play,the video game,the hotel,the restaurant,"
                "the cookbook").split(","))
_ASPECTS = tuple(("the battery life,the build quality,the screen,the sound,the price,the customer service,"
                  "the delivery,the packaging,the plot,the acting,the dialogue,the ending,the pacing,the design,"
                  "the setup,the manual,the cinematography,the menu,the staff,the app,the soundtrack,the warranty,"
                  "the color,the user guide").split(","))
# Every third adjective appears only in the eval split: eval accuracy then also measures
# how well the pretrained model generalizes sentiment to words fine-tuning never showed it.
_POS = tuple(("great,excellent,wonderful,superb,fantastic,impressive,delightful,solid,reliable,charming,brilliant,"
              "lovely,outstanding,terrific,enjoyable,pleasant,flawless,satisfying,amazing,good,sturdy,gorgeous,"
              "fun,worth it,stunning,elegant,nice").split(","))
_NEG = tuple(("terrible,awful,disappointing,poor,dreadful,mediocre,flimsy,boring,clumsy,frustrating,horrible,"
              "lousy,unreliable,dull,annoying,shoddy,bland,tedious,weak,bad,cheap-feeling,useless,a mess,"
              "a waste of money,ugly,pathetic,noisy").split(","))
_ADV = ("", "", "", "really ", "very ", "truly ", "quite ", "surprisingly ", "absolutely ", "genuinely ", "pretty ")
_BE = ("is", "was")
_NOT_BE = ("is not", "was not", "isn't", "wasn't", "was never", "is hardly", "was far from", "is anything but",
           "was not very", "isn't really", "wasn't that")
# (plain, negated) first-person verb phrases; index 1 = positive, 0 = negative.
_VERBS = ((("I hated", "I didn't hate"), ("I regret buying", "I don't regret buying"),
           ("I was let down by", "I was not let down by"), ("we were disappointed by", "we were not disappointed by"),
           ("I returned", "I never returned"), ("I was bored by", "I was never bored by")),
          (("I loved", "I did not love"), ("I really enjoyed", "I did not enjoy"), ("I would recommend",
           "I would not recommend"), ("we were impressed by", "we were not impressed by"),
           ("I adore", "I don't adore"), ("my kids liked", "my kids didn't like")))
_NEUTRAL = ("I bought it last month", "it arrived on a Tuesday", "my sister gave it to me", "we tried it on a "
            "Friday night", "I used it for two weeks", "I picked it up on a long trip", "it came in a blue box",
            "a coworker mentioned it", "I have had it since spring", "we got it during a sale")


def _adjectives(split: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(negative, positive) adjectives usable in `split`."""
    return tuple(tuple(w for i, w in enumerate(ws) if split == "eval" or i % 3 != 2)  # type: ignore[return-value]
                 for ws in (_NEG, _POS))


def _clause(rng: random.Random, subject: str, positive: bool, adjs: tuple[tuple[str, ...], ...]) -> str:
    """A clause about `subject` with the given sentiment, often via a negated opposite."""
    if rng.random() < 0.25 and subject in _ITEMS:
        same = rng.random() < 0.65  # else negate a verb of the opposite sentiment
        plain, negated = rng.choice(_VERBS[int(positive == same)])
        return f"{plain if same else negated} {subject}"
    if rng.random() < 0.35:
        return f"{subject} {rng.choice(_NOT_BE)} {rng.choice(adjs[not positive])}"
    return f"{subject} {rng.choice(_BE)} {rng.choice(_ADV)}{rng.choice(adjs[positive])}"


def _review(rng: random.Random, positive: bool, adjs: tuple[tuple[str, ...], ...]) -> str:
    item = rng.choice(_ITEMS)
    main = _clause(rng, rng.choice((item, item, rng.choice(_ASPECTS))), positive, adjs)
    other = _clause(rng, rng.choice(_ASPECTS), not positive, adjs)  # the contrasting distractor
    good, bad = rng.choice(adjs[positive]), rng.choice(adjs[not positive])
    s = rng.choice((
        f"{main}.",
        f"although {other}, {main}.",
        f"{other}, but {main}.",
        f"{main}, even though {other}.",
        f"{other}. Still, {main}.",
        f"{rng.choice(_NEUTRAL)}, and {main}.",
        f"{main}, and {_clause(rng, rng.choice(_ASPECTS), positive, adjs)} too.",
        f"I expected {item} to be {bad}, but it turned out {good}.",
        f"everyone said {item} was {bad}; honestly, I found it {good}.",
        # Scope tricks: the sentiment word's polarity is the opposite of the label.
        f"the only {bad} thing about {item} was {rng.choice(_ASPECTS)}.",
        f"I can't say {item} was {bad}." if rng.random() < 0.5 else f"nothing about {item} was {bad}.",
        f"I didn't expect to like {item}, but I did." if positive else f"I wanted to like {item}, but I couldn't.",
    ))
    return s[0].upper() + s[1:]


def _split_of(sentence: str) -> str:
    # A content hash, not the RNG stream, decides the split, so train and eval never
    # share a sentence whatever n or seed each was generated with.
    return "eval" if hashlib.blake2b(sentence.encode(), digest_size=8).digest()[0] % 6 == 0 else "train"


def builtin_dataset(split: str, n: int | None = None, seed: int = 0) -> ClassificationData:
    """Balanced 2-class review sentiment; train defaults to 2000 examples, eval to 400."""
    if split not in ("train", "eval"):
        raise CoreCPUError(f"unknown builtin split {split!r}; use 'train' or 'eval'")
    n = (2000 if split == "train" else 400) if n is None else n
    if n < 1:
        raise CoreCPUError(f"builtin dataset size must be positive, got {n}")
    rng = random.Random(f"corecpu-builtin-{seed}-{split}")
    texts: list[str] = []
    labels: list[int] = []
    seen: set[str] = set()
    adjs = _adjectives(split)
    while len(texts) < n:
        pair = [0, 1]
        rng.shuffle(pair)  # labels come in shuffled pairs: balanced at every even prefix
        for lab in pair:
            while True:
                s = _review(rng, bool(lab), adjs)
                if s not in seen and _split_of(s) == split:
                    break
            seen.add(s)
            texts.append(s)
            labels.append(lab)
    return ClassificationData(texts[:n], None, labels[:n], list(LABEL_NAMES), f"builtin:{split}(seed={seed})")


def write_builtin(path: str | Path, split: str = "train", n: int | None = None, seed: int = 0) -> int:
    """Write the builtin split as a TSV with header `sentence<TAB>label`; returns the row count."""
    path = Path(path)
    if not path.parent.is_dir():
        raise CoreCPUError(f"cannot write '{path}': directory '{path.parent}' does not exist; create it first")
    data = builtin_dataset(split, n=n, seed=seed)
    with path.open("w", encoding="utf-8", newline="") as fh:
        fh.write("sentence\tlabel\n")
        for text, lab in zip(data.texts, data.labels):
            fh.write(f"{text}\t{data.label_names[lab]}\n")
    return len(data)


# ---------------------------------------------------------------- tokenization

class TokenizedDataset(Dataset):
    """Tokenizes everything once (truncating, not padding); items are dicts of int lists."""

    def __init__(self, data: ClassificationData, tokenizer: Any, max_seq_len: int) -> None:
        specials = tokenizer.num_special_tokens_to_add(pair=data.text_pairs is not None)
        if max_seq_len <= specials + 1:
            raise CoreCPUError(f"max sequence length {max_seq_len} leaves no room for text after {specials} "
                               "special tokens; pass a larger --max-seq-len (e.g. 128)")
        enc = tokenizer(data.texts, data.text_pairs, truncation=True, max_length=max_seq_len, padding=False)
        self.input_ids: list[list[int]] = enc["input_ids"]
        self.token_type_ids: list[list[int]] | None = enc.get("token_type_ids")
        self.labels = data.labels
        self.label_names = data.label_names
        self.tokenizer = tokenizer
        # Upper bound on truncated examples (an untruncated one can be exactly max long).
        self.num_at_max_len = sum(len(ids) >= max_seq_len for ids in self.input_ids)

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, key: int | tuple[int, bool]) -> dict[str, Any]:
        # EvalShardSampler yields (index, valid) so filler items reach collate marked invalid.
        i, valid = key if isinstance(key, tuple) else (key, True)
        item: dict[str, Any] = {"input_ids": self.input_ids[i], "labels": self.labels[i], "valid": valid}
        if self.token_type_ids is not None:
            item["token_type_ids"] = self.token_type_ids[i]
        return item


def make_collate(tokenizer: Any):
    """Pad to the longest item in the batch; adds META_KEYS (see module docstring)."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    left = getattr(tokenizer, "padding_side", "right") == "left"

    def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
        lengths = [len(it["input_ids"]) for it in items]
        width = max(lengths)
        ids = torch.full((len(items), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        types = torch.zeros((len(items), width), dtype=torch.long) if "token_type_ids" in items[0] else None
        for row, (it, n) in enumerate(zip(items, lengths)):
            cols = slice(width - n, width) if left else slice(0, n)
            ids[row, cols] = torch.tensor(it["input_ids"], dtype=torch.long)
            mask[row, cols] = 1
            if types is not None:
                types[row, cols] = torch.tensor(it["token_type_ids"], dtype=torch.long)
        batch: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
        if types is not None:
            batch["token_type_ids"] = types
        batch["labels"] = torch.tensor([it["labels"] for it in items], dtype=torch.long)
        batch["num_tokens"] = sum(lengths)
        batch["valid"] = torch.tensor([it.get("valid", True) for it in items], dtype=torch.bool)
        return batch

    return collate


# ---------------------------------------------------------------- samplers and loaders

class ResumableDistributedSampler(DistributedSampler):
    """DistributedSampler (pads with duplicates so ranks take equal steps) that can skip
    the first k batches of an epoch by slicing its index list."""

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, shuffle: bool, seed: int,
                 batch_size: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=False)
        self.batch_size = batch_size
        self.skip = 0

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        super().set_epoch(epoch)
        self.skip = min(skip_batches * self.batch_size, self.num_samples)

    def __iter__(self) -> Iterator[int]:
        return iter(list(super().__iter__())[self.skip:])

    def __len__(self) -> int:
        return self.num_samples - self.skip


class EvalShardSampler(ResumableDistributedSampler):
    """Each rank gets its true strided shard, padded with (index, valid=False) fillers to
    ceil(N / world) items so every rank runs the same number of batches."""

    def __iter__(self) -> Iterator[tuple[int, bool]]:  # type: ignore[override]
        n = len(self.dataset)  # type: ignore[arg-type]
        real = [(i, True) for i in range(self.rank, n, self.num_replicas)]
        fill = [(i % n, False) for i in range(self.num_samples - len(real))]
        return iter((real + fill)[self.skip:])


def _loader(dataset: TokenizedDataset, sampler_cls: type, batch_size: int, rank: int, world_size: int,
            shuffle: bool, seed: int, drop_last: bool, num_workers: int) -> DataLoader:
    if batch_size < 1:
        raise CoreCPUError(f"batch size must be at least 1, got {batch_size}; pass a positive --batch-size")
    if not 0 <= rank < world_size:
        raise CoreCPUError(f"rank {rank} is outside world size {world_size}; check the launcher's environment")
    sampler = sampler_cls(dataset, world_size, rank, shuffle, seed, batch_size)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last,
                      collate_fn=make_collate(dataset.tokenizer), num_workers=num_workers)


def build_loader(dataset: TokenizedDataset, batch_size: int, rank: int, world_size: int, seed: int = 0,
                 shuffle: bool = True, drop_last: bool = False, num_workers: int = 0) -> DataLoader:
    """Training loader: per-rank batch_size; the sampler pads with duplicates so every
    rank gets ceil(N / world) samples. drop_last drops each rank's short final batch.
    num_workers defaults to 0: data is pre-tokenized and workers would steal compute cores."""
    return _loader(dataset, ResumableDistributedSampler, batch_size, rank, world_size, shuffle, seed,
                   drop_last, num_workers)


def build_eval_loader(dataset: TokenizedDataset, batch_size: int, rank: int, world_size: int,
                      num_workers: int = 0) -> DataLoader:
    """Eval loader: no shuffling, no duplicates. Sum metrics weighted by batch['valid'] and
    all-reduce the sums: each example is counted exactly once across ranks."""
    return _loader(dataset, EvalShardSampler, batch_size, rank, world_size, False, 0, False, num_workers)


def set_epoch(loader: DataLoader, epoch: int, skip_batches: int = 0) -> None:
    """Call before each epoch. skip_batches (resume only) applies to this epoch alone;
    the next set_epoch resets it. Batches after the skip are identical to an unskipped run."""
    loader.sampler.set_epoch(epoch, skip_batches)  # type: ignore[union-attr]


def steps_per_epoch(num_examples: int, batch_size: int, world_size: int, drop_last: bool = False) -> int:
    """Optimizer steps per epoch on every rank (before gradient accumulation)."""
    per_rank = math.ceil(num_examples / world_size)
    return per_rank // batch_size if drop_last else math.ceil(per_rank / batch_size)
