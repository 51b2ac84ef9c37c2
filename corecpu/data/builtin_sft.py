"""A generated instruction set for supervised fine-tuning of causal LMs (`--data sft`): no download.

Three skills, each in a few phrasings, that a model can only do by reading the prompt:

  lookup   "Given fox: red, owl: blue, bee: gold. What is owl?" -> " blue"    (copy the named key's value)
  reverse  "Reverse the list: red boat sky pen"                -> " pen sky boat red"
  add      "Question: What is 23 + 18?\\nAnswer:"               -> " 41"        (two numbers below 50)

Values, lists and numbers are drawn at random, so the best answer that ignores the prompt's content
(the most frequent training completion of the skill: unigram_baseline) is right about 3% of the time
(lookup about 10%: 12 colours; reverse and add under 1%).
Prompts are 4-38 whitespace words (6-48 tokens of the built-in tokenizer with its <s>, median 16; it splits
numbers into digits), completions 1-5 words (1-5 tokens), without the EOS.

Prompts end without whitespace and completions start with a space, so a byte-level BPE (which attaches a
space to the word after it) gives the same tokens for prompt and completion tokenized apart as joined.

A content hash assigns examples to splits, not the random stream (as in corecpu.data.builtin): for `add`
the unordered pair of numbers, for `reverse` the list, for `lookup` the prompt. So eval asks sums of pairs
and reversals of lists that training never showed, whatever the seed. Torch-free.
"""

from __future__ import annotations

import hashlib
import random
import re
import statistics
from collections import Counter
from collections.abc import Callable, Iterator, Sequence

from corecpu.data.builtin import builtin_dataset, paraphrase_dataset
from corecpu.data.builtin_qa import builtin_qa_dataset
from corecpu.errors import CoreCPUError

SFT_NAME = "sft"  # the --data value
SKILLS = ("lookup", "reverse", "add")
SIZES = {"train": 6000, "eval": 300}
EVAL_SHARE = 20  # one content hash in EVAL_SHARE goes to eval

_KEYS = tuple("fox owl bee cat dog elk yak ant bat cow hen pig ram emu gnu eel jay koi".split())
_VALUES = tuple("red blue green gold pink gray black white brown orange purple silver".split())
_WORDS = tuple(("red blue green gold pink gray black white sky sun moon star rain snow wind leaf tree rock sand "
                "salt milk bread cake fish bird frog lion wolf bear deer duck goat lamb mouse horse boat car "
                "bus train ship road door wall roof lamp book pen cup bowl hat shoe ring key box").split())
_PREFIXES = ("", "", "", "Question: ", "Please answer briefly. ", "Task: ", "Here is a small puzzle for you. ",
             "Answer with the result only. ")
_SUFFIXES = ("", "", "\nAnswer:")


def _lookup(rng: random.Random) -> tuple[str, str, str]:
    # The value follows a space in every wording, so it is the same token in the list as in the answer.
    keys = rng.sample(_KEYS, rng.randint(1, 6))
    values = [rng.choice(_VALUES) for _ in keys]
    q, answer = rng.choice(list(zip(keys, values)))
    pairs = [f"{k}: {v}" for k, v in zip(keys, values)]
    said = [f"the {k} is {v}" for k, v in zip(keys, values)]
    said_all = ", ".join(said[:-1]) + " and " + said[-1] if len(said) > 1 else said[0]
    prompt = rng.choice((
        f"Given {', '.join(pairs)}. What is {q}?",
        f"{said_all[0].upper()}{said_all[1:]}. What color is the {q}?",
        f"Colors: {'; '.join(f'{k} {v}' for k, v in zip(keys, values))}\nWhat color is {q}?",
        f"Look up {q} in: {', '.join(pairs)}.",
    ))
    return prompt, f" {answer}", prompt


def _reverse(rng: random.Random) -> tuple[str, str, str]:
    words = rng.sample(_WORDS, rng.randint(2, 5))
    listed = " ".join(words)
    prompt = rng.choice((
        f"Reverse the list: {listed}",
        f"Write these words in reverse order: {listed}",
        f"List: {listed}. Reversed:",
        f"Say the words backwards, last one first: {listed}",
    ))
    return prompt, " " + " ".join(reversed(words)), listed


def _add(rng: random.Random) -> tuple[str, str, str]:
    a, b = rng.randrange(50), rng.randrange(50)
    prompt = rng.choice((f"What is {a} + {b}?", f"Add {a} and {b}.", f"Compute the sum of {a} and {b}.",
                         f"{a} plus {b} equals", f"What do you get when you add {a} to {b}?"))
    return prompt, f" {a + b}", f"{min(a, b)}+{max(a, b)}"


_MAKERS: dict[str, Callable[[random.Random], tuple[str, str, str]]] = {"lookup": _lookup, "reverse": _reverse,
                                                                       "add": _add}


def split_of(skill: str, content: str) -> str:
    """'eval' or 'train' by a hash of what the example asks (not of its wording or the random stream)."""
    digest = hashlib.blake2b(f"{skill}|{content}".encode(), digest_size=8).digest()
    return "eval" if int.from_bytes(digest, "big") % EVAL_SHARE == 0 else "train"


def builtin_sft(split: str, seed: int = 0) -> list[tuple[str, str]]:
    """(prompt, completion) pairs, the skills in equal shares; train 6000, eval 300, disjoint, deterministic."""
    if split not in SIZES:
        raise CoreCPUError(f"unknown {SFT_NAME} split {split!r}; use 'train' or 'eval'")
    rng = random.Random(f"corecpu-sft-{seed}-{split}")
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    while len(out) < SIZES[split]:
        order = list(SKILLS)
        rng.shuffle(order)  # skills in shuffled triples: balanced at every prefix that is a multiple of 3
        for skill in order:
            while True:
                body, completion, content = _MAKERS[skill](rng)
                prompt = rng.choice(_PREFIXES) + body
                prompt += rng.choice(_SUFFIXES) if not prompt.endswith(":") else ""
                if prompt not in seen and split_of(skill, content) == split:
                    break
            seen.add(prompt)
            out.append((prompt, completion))
    return out[:SIZES[split]]


def skill_of(prompt: str) -> str:
    """Which skill a prompt of this set asks for (read from its wording)."""
    if re.search(r"\d", prompt):
        return "add"
    if re.search(r"[Rr]everse|backwards", prompt):
        return "reverse"
    return "lookup"


def _norm(text: str) -> str:
    return " ".join(text.split())


def exact_match(prediction: str, reference: str) -> bool:
    """Equal after collapsing whitespace (leading, trailing, runs of spaces and newlines)."""
    return _norm(prediction) == _norm(reference)


def unigram_baseline(train: Sequence[tuple[str, str]], eval: Sequence[tuple[str, str]]) -> float:  # noqa: A002
    """Exact match on `eval` of answering every prompt of a skill with that skill's most frequent training
    completion: the score of a model that knows the skills' formats but ignores what the prompt says."""
    if not eval:
        raise CoreCPUError("no eval examples to score the baseline on")
    counts: dict[str, Counter[str]] = {}
    for prompt, completion in train:
        counts.setdefault(skill_of(prompt), Counter())[_norm(completion)] += 1
    best = {skill: c.most_common(1)[0][0] for skill, c in counts.items()}
    return sum(exact_match(best.get(skill_of(p), ""), c) for p, c in eval) / len(eval)


def describe_lengths(examples: Sequence[tuple[str, str]]) -> str:
    """One line: prompt and completion lengths in whitespace-separated words, with a prompt histogram."""
    if not examples:
        raise CoreCPUError("no examples to describe")
    prompts = sorted(len(p.split()) for p, _ in examples)
    completions = [len(c.split()) for _, c in examples]
    bins = ((1, 4), (5, 8), (9, 12), (13, 16), (17, 20), (21, 10**9))
    hist = ", ".join(f"{lo}-{hi if hi < 10**9 else ''}: {100 * sum(lo <= n <= hi for n in prompts) / len(prompts):.0f}%"
                     for lo, hi in bins)
    return (f"{len(examples)} examples; prompt words (whitespace-split) min {prompts[0]}, median "
            f"{statistics.median(prompts):g}, max {prompts[-1]} ({hist}); completion words {min(completions)}-"
            f"{max(completions)}, mean {statistics.fmean(completions):.1f}")


def tokenizer_corpus() -> Iterator[str]:
    """Text to train the built-in tokenizer on, the same every time: the train split (prompt + completion),
    every word and number the skills use, then the other built-in sets' train text (reviews, news pairs,
    QA questions and contexts) so that everyday English, as in a user's conversations, gets whole words."""
    for prompt, completion in builtin_sft("train"):
        yield prompt + completion
    yield " ".join(_KEYS + _VALUES + _WORDS)
    yield " ".join(str(n) for n in range(100))
    yield from builtin_dataset("train").texts
    news = paraphrase_dataset("train")
    yield from news.texts
    yield from news.text_pairs or ()
    contexts: dict[str, None] = {}  # questions share contexts: each context once, in order
    for ex in builtin_qa_dataset("train").examples:
        yield ex.question
        contexts[ex.context] = None
    yield from contexts


__all__ = ["SFT_NAME", "SKILLS", "builtin_sft", "split_of", "skill_of", "exact_match", "unigram_baseline",
           "describe_lengths", "tokenizer_corpus"]
