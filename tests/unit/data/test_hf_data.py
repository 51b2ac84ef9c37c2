"""Hugging Face datasets sources (Parquet, Arrow, save_to_disk) and the per-host tokenization cache.
Two ranks sharing the cache: tests/multiprocess/test_tokenization_cache.py."""

from __future__ import annotations

import pytest

from corecpu.data.sources import load_data
from corecpu.data.tokenized import TokenizedDataset
from corecpu.data.types import ClassificationData
from corecpu.errors import CoreCPUError
from corecpu.data.hf import is_hf_source, load_hf_dataset
from corecpu.data.sources import auto_eval_data
from corecpu.data.tokencache import cache_path, tokenize_cached

datasets = pytest.importorskip("datasets")
from datasets import ClassLabel, Dataset, DatasetDict, Features, Value  # noqa: E402

TEXTS = ["good film", "bad film", "great plot", "dull plot", "fine acting", "poor acting"]


def classlabel_set(labels=(1, 0, 1, 0, 1, 0), names=("neg", "pos")) -> Dataset:
    feats = Features({"idx": Value("int32"), "sentence": Value("string"), "label": ClassLabel(names=list(names))})
    return Dataset.from_dict({"idx": list(range(len(labels))), "sentence": TEXTS[:len(labels)], "label": list(labels)},
                             features=feats)


def test_parquet_with_classlabel_keeps_names_and_ids(tmp_path):
    path = tmp_path / "train.parquet"
    # "pos" first: ids follow the ClassLabel's order, not alphabetical order.
    classlabel_set(names=("pos", "neg")).to_parquet(str(path))
    data = load_data(str(path))
    assert data.label_names == ["pos", "neg"] and data.labels == [1, 0, 1, 0, 1, 0]
    assert type(data.texts) is list and data.texts == TEXTS and data.text_pairs is None and is_hf_source(path)


def test_save_to_disk_dict_splits_and_eval_auto(tmp_path):
    d = tmp_path / "dd"
    DatasetDict(train=classlabel_set(), validation=classlabel_set(labels=(0, 0, 1))).save_to_disk(str(d))
    train = load_data(str(d), split="train")
    evald = load_data(str(d), split="eval", label_names=train.label_names)
    assert len(train) == 6 and evald.labels == [0, 0, 1] and evald.texts == TEXTS[:3]
    assert auto_eval_data(str(d)) == str(d) and auto_eval_data("builtin") == "builtin"
    assert auto_eval_data(str(tmp_path / "x.tsv")) == "none"
    DatasetDict(train=classlabel_set()).save_to_disk(str(tmp_path / "only"))
    assert auto_eval_data(str(tmp_path / "only")) == "none"
    with pytest.raises(CoreCPUError, match=r"has splits 'train', none named 'validation' or 'test'"):
        load_data(str(tmp_path / "only"), split="eval")


def test_arrow_file_and_single_dataset_dir_with_string_labels_and_pairs(tmp_path):
    ds = Dataset.from_dict({"sentence1": TEXTS[:4], "sentence2": TEXTS[2:6], "label": ["b", "a", "10", "a"]})
    ds.save_to_disk(str(tmp_path / "single"))
    data = load_data(str(tmp_path / "single"))
    assert data.text_pairs == TEXTS[2:6] and data.label_names == ["10", "a", "b"] and data.labels == [2, 1, 0, 1]
    arrow = next((tmp_path / "single").glob("*.arrow"))
    assert load_data(str(arrow)).texts == data.texts


def test_column_flags_by_name_and_index(tmp_path):
    ds = Dataset.from_dict({"id": [1, 2, 3], "review": ["a", "b", "c"], "stars": [1, 5, 5]})
    path = tmp_path / "r.parquet"
    ds.to_parquet(str(path))
    with pytest.raises(CoreCPUError, match="cannot tell which columns hold the text and label"):
        load_hf_dataset(path)
    by_name = load_hf_dataset(path, text_column="review", label_column="stars")
    by_index = load_hf_dataset(path, text_column=1, label_column="2")
    assert by_name == by_index and by_name.label_names == ["1", "5"] and by_name.labels == [0, 1, 1]
    with pytest.raises(CoreCPUError, match="no label column named 'rating'.*--label-column"):
        load_hf_dataset(path, text_column="review", label_column="rating")
    with pytest.raises(CoreCPUError, match="text column index 7 is out of range"):
        load_hf_dataset(path, text_column=7, label_column="stars")
    with pytest.raises(CoreCPUError, match="text must be a string, found int"):
        load_hf_dataset(path, text_column="id", label_column="stars")


def test_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    floats = tmp_path / "f.parquet"
    Dataset.from_dict({"text": ["a", "b"], "label": [0.5, 1.5]}).to_parquet(str(floats))
    unlabelled = tmp_path / "u.parquet"
    classlabel_set(labels=(0, -1)).to_parquet(str(unlabelled))
    cases = [(lambda: load_data(str(bad)), "cannot be read as a Hugging Face dataset"),
             (lambda: load_data(str(tmp_path / "missing.parquet")), "not found"),
             (lambda: load_data(str(floats)), "not regression"),
             (lambda: load_data(str(unlabelled)), "label id -1 is not a class"),
             (lambda: load_hf_dataset(floats, fmt="csv"), "--data-format csv does not apply"),
             (lambda: load_data(str(tmp_path / "f.parquet"), split="eval", label_names=["x", "y"]),
              "not regression")]
    for call, pattern in cases:
        with pytest.raises(CoreCPUError, match=pattern) as err:
            call()
        assert "\n" not in str(err.value)
    ok = tmp_path / "ok.parquet"
    Dataset.from_dict({"text": ["a", "b"], "label": ["x", "z"]}).to_parquet(str(ok))
    with pytest.raises(CoreCPUError, match="label 'z' is not in the training data's labels"):
        load_data(str(ok), split="eval", label_names=["x", "y"])


def test_without_datasets_names_the_extra(tmp_path, monkeypatch):
    path = tmp_path / "train.parquet"
    classlabel_set().to_parquet(str(path))
    monkeypatch.setitem(__import__("sys").modules, "datasets", None)
    with pytest.raises(CoreCPUError, match=r"pip install 'corecpu\[datasets\]'"):
        load_data(str(path))


def test_plain_files_still_go_to_the_file_loader(tmp_path):
    tsv = tmp_path / "d.tsv"
    tsv.write_text("sentence\tlabel\na\t0\nb\t1\n")
    assert not is_hf_source(tsv) and load_data(str(tsv)).texts == ["a", "b"]


# ---------------------------------------------------------------- tokenization cache

class CountingTokenizer:
    """Stands in for a tokenizer: ids are character codes; counts calls."""

    def __init__(self, offset: int = 0) -> None:
        self.calls, self.offset, self.pad_token_id = 0, offset, 0

    def num_special_tokens_to_add(self, pair: bool) -> int:
        return 2

    def get_vocab(self) -> dict[str, int]:
        return {"offset": self.offset}

    special_tokens_map: dict = {}

    def __call__(self, texts, pairs, truncation, max_length, padding):
        self.calls += 1
        return {"input_ids": [[1] + [ord(c) + self.offset for c in t][: max_length - 2] + [2] for t in texts]}


def small_data(texts=("abc", "de", "fghij")) -> ClassificationData:
    return ClassificationData(list(texts), None, [0, 1, 0][:len(texts)], ["n", "p"], "test")


def test_cache_hit_skips_tokenizing_and_keys_on_inputs(tmp_path):
    tok = CountingTokenizer()
    first = tokenize_cached(small_data(), tok, 4, tmp_path, local_rank=0, wait=lambda: None)
    again = tokenize_cached(small_data(), tok, 4, tmp_path, local_rank=0, wait=lambda: None)
    assert tok.calls == 1 and type(again).__name__ == "CachedTokenizedDataset"
    assert again.input_ids == first.input_ids == TokenizedDataset(small_data(), CountingTokenizer(), 4).input_ids
    assert again.labels == [0, 1, 0] and again.label_names == ["n", "p"] and again[1]["input_ids"] == [1, 100, 101, 2]
    paths = {cache_path(tmp_path, small_data(), tok, 4), cache_path(tmp_path, small_data(), tok, 5),
             cache_path(tmp_path, small_data(("abc", "de", "fghiX")), tok, 4),
             cache_path(tmp_path, small_data(), CountingTokenizer(offset=1), 4)}
    assert len(paths) == 4


def test_unwritable_or_torn_cache_falls_back_to_tokenizing(tmp_path):
    tok = CountingTokenizer()
    path = cache_path(tmp_path, small_data(), tok, 4)
    path.write_bytes(b"torn")
    assert tokenize_cached(small_data(), tok, 4, tmp_path, local_rank=0, wait=lambda: None).input_ids[0] == [1, 97, 98, 2]
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    other = tokenize_cached(small_data(), tok, 4, blocked / "sub", local_rank=1, wait=lambda: None)
    assert other.input_ids[2] == [1, 102, 103, 2] and tok.calls == 2
    writer = tokenize_cached(small_data(), tok, 4, blocked / "sub", local_rank=0, wait=lambda: None)
    assert writer.input_ids == other.input_ids and tok.calls == 3


def test_a_cache_file_whose_ids_rotted_is_rebuilt(tmp_path, capsys):
    import torch

    tok = CountingTokenizer()
    clean = tokenize_cached(small_data(), tok, 4, tmp_path, local_rank=0, wait=lambda: None).input_ids
    path = cache_path(tmp_path, small_data(), tok, 4)
    state = torch.load(path, weights_only=True)
    state["input_ids"][1] = 0  # still a valid file, with one token id changed ([UNK]-like)
    torch.save(state, path)
    again = tokenize_cached(small_data(), tok, 4, tmp_path, local_rank=0, wait=lambda: None)
    assert again.input_ids == clean and tok.calls == 2
    assert "does not match its checksum (a damaged file); tokenizing again" in capsys.readouterr().err
    fixed = tokenize_cached(small_data(), tok, 4, tmp_path, local_rank=0, wait=lambda: None)
    assert fixed.input_ids == clean and tok.calls == 2  # the rewritten file verifies


def test_a_file_where_the_cache_directory_belongs_is_named(tmp_path, capsys, monkeypatch):
    # Issue 30 case 11(b): "cannot write the tokenization cache ... (File exists)" hid the real problem.
    from corecpu import notices

    monkeypatch.setattr(notices, "_said", set())
    (tmp_path / "tokenized").write_text("")  # what a user's `touch ~/.cache/corecpu/tokenized` leaves
    tok = CountingTokenizer()
    data = tokenize_cached(small_data(), tok, 4, tmp_path / "tokenized", local_rank=0, wait=lambda: None)
    assert data.input_ids[0] == [1, 97, 98, 2]
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"corecpu: warning: cannot write the tokenization cache in {tmp_path / 'tokenized'} (") and "\n" not in err
    assert f"{tmp_path / 'tokenized'} is a file where a directory is expected; remove or rename it" in err
    assert "File exists" not in err
