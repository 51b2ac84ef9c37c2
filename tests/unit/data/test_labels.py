"""One rule for labels from every source: a missing value is not a class, case differences are named,
a class with very few examples is worth a warning, a header may not name a column twice."""

from __future__ import annotations

import json

import pytest

from corecpu.data.files import load_file
from corecpu.data.sources import load_data
from corecpu.errors import CoreCPUError


def tsv(tmp_path, rows: list[tuple[str, str]], header: str = "text\tlabel") -> str:
    path = tmp_path / "d.tsv"
    path.write_text(header + "\n" + "".join(f"{t}\t{label}\n" for t, label in rows))
    return str(path)


@pytest.mark.parametrize("missing", ["NaN", "nan", "null", "None", "N/A"])
def test_a_missing_value_is_not_a_class(tmp_path, missing):
    path = tsv(tmp_path, [("good", "pos"), ("bad", "neg"), ("odd", missing)])
    with pytest.raises(CoreCPUError, match=f"line 4: label '{missing}' is a missing value, not a class; fix or remove"):
        load_file(path)


def test_labels_differing_only_in_case_are_named_but_spaces_are_stripped(tmp_path):
    with pytest.raises(CoreCPUError, match="line 2 and line 4: labels 'POS' and 'pos' differ only in case"):
        load_file(tsv(tmp_path, [("a", "POS"), ("b", "neg"), ("c", "pos")]))
    data = load_file(tsv(tmp_path, [("a", " pos"), ("b", "neg"), ("c", "pos ")]))
    assert data.label_names == ["neg", "pos"] and data.labels == [1, 0, 1]


def test_a_rare_class_gives_a_note(tmp_path):
    rows = [(f"t{i}", "pos" if i % 2 else "neg") for i in range(600)] + [("x", "maybe")]
    data = load_file(tsv(tmp_path, rows))
    assert data.notes == [f"data '{tmp_path / 'd.tsv'}': label 'maybe' has only 1 of 601 examples; check the label column"]
    assert load_file(tsv(tmp_path, rows[:600])).notes == []


def test_a_duplicate_header_column_is_an_error(tmp_path):
    with pytest.raises(CoreCPUError, match="the header names column 'text' twice; rename one of them"):
        load_file(tsv(tmp_path, [("a\tb", "pos"), ("c\td", "neg")], header="text\ttext\tlabel"))


def test_the_same_rules_for_a_hugging_face_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    path = tmp_path / "d.parquet"
    datasets.Dataset.from_dict({"text": ["a", "b", "c"], "label": ["pos", "neg", "Pos"]}).to_parquet(str(path))
    with pytest.raises(CoreCPUError, match="row 0 and row 2: labels 'pos' and 'Pos' differ only in case"):
        load_data(str(path))


def test_jsonl_numbers_and_strings_keep_their_rules(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in [("a", 1), ("b", 0), ("c", 1.0)]))
    assert load_file(str(path)).label_names == ["0", "1"]
