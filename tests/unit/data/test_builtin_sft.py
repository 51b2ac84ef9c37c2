"""corecpu.data.builtin_sft: the generated instruction set for causal-LM fine-tuning (torch-free)."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from corecpu.data.builtin_sft import (
    SFT_NAME,
    SKILLS,
    builtin_sft,
    describe_lengths,
    exact_match,
    skill_of,
    split_of,
    tokenizer_corpus,
    unigram_baseline,
)
from corecpu.errors import CoreCPUError


@pytest.fixture(scope="module")
def train():
    return builtin_sft("train")


@pytest.fixture(scope="module")
def ev():
    return builtin_sft("eval")


def test_sizes_determinism_and_seeds(train, ev):
    assert SFT_NAME == "sft"
    assert (len(train), len(ev)) == (6000, 300)
    assert builtin_sft("train") == train and builtin_sft("eval") == ev
    assert builtin_sft("eval", seed=1) != ev
    assert len({p for p, _ in train}) == len(train)  # no prompt twice
    with pytest.raises(CoreCPUError, match="unknown sft split 'test'"):
        builtin_sft("test")


def test_splits_are_disjoint_by_what_they_ask(train, ev):
    # Not just different prompts: eval's sums and lists never appear in training in any wording or order.
    assert not {p for p, _ in train} & {p for p, _ in ev}
    assert not {p for p, _ in builtin_sft("train", seed=1)} & {p for p, _ in ev}

    def asked(prompt: str) -> str:
        if skill_of(prompt) == "add":
            return "+".join(sorted(re.findall(r"\d+", prompt)))
        return prompt.split(":")[-1] if skill_of(prompt) == "reverse" else prompt

    sums = {asked(p) for p, _ in train if skill_of(p) == "add"}
    assert not sums & {asked(p) for p, _ in ev if skill_of(p) == "add"}
    assert split_of("add", "3+4") == split_of("add", "3+4")


def test_skills_balanced_and_answers_right(train, ev):
    assert Counter(skill_of(p) for p, _ in ev) == {s: 100 for s in SKILLS}
    for prompt, completion in train[:600]:
        assert not prompt[-1].isspace() and completion.startswith(" ") and not completion.startswith("  ")
        skill = skill_of(prompt)
        if skill == "add":
            a, b = map(int, re.findall(r"\d+", prompt))
            assert a < 50 and b < 50 and completion == f" {a + b}"
        elif skill == "lookup":
            asked = re.search(r"(?:What is|What color is(?: the)?|Look up) (\w+)", prompt).group(1)
            stated = dict(re.findall(r"\b(\w+)(?::| is)? (\w+)(?=[,;.\n]| and)", prompt.split("What")[0]))
            assert completion == " " + stated[asked], (prompt, stated)
        else:
            words = completion.split()
            assert 2 <= len(words) <= 5 and " ".join(reversed(words)) in prompt
        assert "</s>" not in completion


def test_prompt_lengths_spread(train):
    words = [len(p.split()) for p, _ in train]
    assert min(words) <= 5 and max(words) >= 18 and 8 <= sorted(words)[len(words) // 2] <= 14
    assert max(len(c.split()) for _, c in train) <= 5
    line = describe_lengths(train)
    assert line.startswith("6000 examples; prompt words (whitespace-split) min ") and "\n" not in line


def test_exact_match_normalises_whitespace():
    assert exact_match(" 41", "41") and exact_match("pin  sky\n", " pin sky")
    assert not exact_match("41", "14") and not exact_match("pin sky cow", "pin sky")


def test_unigram_baseline_is_low_and_right(train, ev):
    base = unigram_baseline(train, ev)
    assert 0.0 <= base < 0.1
    # A constant answer per skill that is always right scores 1; one never right scores 0.
    same = [("Add 1 and 2.", " 3"), ("List: a b. Reversed:", " b a"), ("Given fox: red. What is fox?", " red")]
    assert unigram_baseline(same, same) == 1.0
    assert unigram_baseline(same, [("Add 2 and 2.", " 4")]) == 0.0
    with pytest.raises(CoreCPUError):
        unigram_baseline(train, [])


def test_tokenizer_corpus_is_deterministic_and_covers_the_set(train):
    corpus = list(tokenizer_corpus())
    assert corpus == list(tokenizer_corpus())
    assert corpus[0] == train[0][0] + train[0][1] and len(corpus) > len(train)
