"""Built-in tasks: generated, deterministic classification data that needs no download.

  builtin     review sentiment, single sentences of about 15 tokens (the default job);
  paraphrase  news-style sentence pairs with real-data lengths (mean about 50 tokens per
              pair, a tail past 128), the benchmark set for padding and length grouping.

Each task has a train and an eval split, generated from the seed; a content hash, not the
random stream, assigns sentences to splits, so the two never share an example.
"""

from __future__ import annotations

import hashlib
import math
import random
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from corecpu.data.types import ClassificationData
from corecpu.errors import CoreCPUError

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


def split_of(sentence: str) -> str:
    # A content hash, not the RNG stream, decides the split, so train and eval never
    # share a sentence whatever n or seed each was generated with.
    return "eval" if hashlib.blake2b(sentence.encode(), digest_size=8).digest()[0] % 6 == 0 else "train"


def split_size(task: str, split: str, n: int | None, train_n: int, eval_n: int) -> int:
    """How many examples a task's split gets; one message for every task's bad split or size."""
    if split not in ("train", "eval"):
        raise CoreCPUError(f"unknown {task} split {split!r}; use 'train' or 'eval'")
    n = (train_n if split == "train" else eval_n) if n is None else n
    if n < 1:
        raise CoreCPUError(f"{task} dataset size must be positive, got {n}")
    return n


def builtin_dataset(split: str, n: int | None = None, seed: int = 0) -> ClassificationData:
    """Balanced 2-class review sentiment; train defaults to 2000 examples, eval to 400."""
    n = split_size("builtin", split, n, 2000, 400)
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
                if s not in seen and split_of(s) == split:
                    break
            seen.add(s)
            texts.append(s)
            labels.append(lab)
    return ClassificationData(texts[:n], None, labels[:n], list(LABEL_NAMES), f"builtin:{split}(seed={seed})")


# ---------------------------------------------------------------- paraphrase task
# News-style sentence pairs like MRPC: both sides describe the same events, always reworded
# (the two sides never use the same wording of an event, numbers are spelled differently).
# A negative rewords the same way but changes one fact of the main event: mostly the
# direction or polarity of the action (rose/fell, hire/cut, won/lost, acquired/called off its
# bid), sometimes a number. Background clauses state neutral facts (no direction or polarity),
# reworded and never changed; a geometric number of them gives real-data lengths: mostly
# 30-70 tokens per pair, a tail past 128. Stories lean "up" (70%) and plain (70% not negated),
# so each direction word shows up in both labels and only the pair's agreement decides.

PARAPHRASE_LABELS = ["not_paraphrase", "paraphrase"]
_FIRMS = tuple(("Acme,Northwind,Globex,Initech,Vandelay Industries,Stark Logistics,Wayne Biotech,Umbrella Pharma,"
                "Hooli,Soylent Foods,Cyberdyne Systems,Tyrell Energy,Oscorp,Massive Dynamic,Blue Harbor Bank,"
                "Red Rock Mining,Silver Lake Airlines,Pinecrest Insurance,Ironclad Steel,Bright Path Telecom,"
                "Golden Valley Farms,Summit Motors,Harbor Freightways,Crescent Media").split(","))
_PEOPLE = tuple(("Maria Lopez,James Chen,Aisha Okafor,Robert Klein,Priya Natarajan,Tomasz Nowak,Elena Petrova,"
                 "David Mensah,Sofia Rossi,Kenji Watanabe,Laura Schmidt,Omar Haddad,Grace Kim,Daniel Murphy,"
                 "Fatima Zahra,Lucas Silva,Hannah Berg,Victor Dumont").split(","))
_CITIES = tuple(("Denver,Houston,Toronto,Lyon,Osaka,Leeds,Austin,Munich,Perth,Rotterdam,Nairobi,Dublin,Seattle,"
                 "Valencia,Krakow,Boston").split(","))
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday")
_COURTS = ("a federal court", "the state supreme court", "a district court", "an appeals court")
_BODIES = ("the city council", "the board", "the Senate committee", "the shareholders", "the zoning board",
           "the school board")
_PLANS = ("budget", "merger", "pay deal", "tax proposal", "expansion plan", "safety rules", "stadium project")
_WORDS = ("zero one two three four five six seven eight nine ten eleven twelve").split()


def _num(n: int, rng: random.Random) -> str:
    return _WORDS[n] if n < len(_WORDS) and rng.random() < 0.5 else str(n)


def _fmt(e: dict, key: str, options: Sequence[str], rng: random.Random) -> str:
    """One of `options`, never the one the last rendering of e used for `key`."""
    i = rng.choice([j for j in range(len(options)) if j != e.get(key)])
    e[key] = i
    return options[i]


def _money(e: dict, rng: random.Random) -> str:
    """e["m"] in units of $100,000, spelled one of several ways, never the last one used."""
    whole, tenth = divmod(e["m"], 10)
    short = f"{whole}.{tenth}" if tenth else str(whole)
    return _fmt(e, "_money", (f"${short} million", f"{short} million dollars", f"US${short}m"), rng)


def _pct(e: dict, rng: random.Random) -> str:
    """e["n"] percent: "12%" on one side of a pair, "12 percent" or "12 per cent" on the other."""
    sign = not e["_pct"] if "_pct" in e else rng.random() < 0.5
    e["_pct"] = sign
    return f"{e['n']}%" if sign else rng.choice((f"{e['n']} percent", f"{e['n']} per cent"))


def _pick(e: dict, rng: random.Random, options: Sequence[str]) -> str:
    """One wording of event e, never the one its last rendering used: the two sides of a pair
    then never share a verb template, which would tell a bag of words they are paraphrases."""
    last = e.get("_last")
    last = last if last is not None and last < len(options) else None
    i = rng.randrange(len(options) - (last is not None and len(options) > 1))
    if last is not None and len(options) > 1 and i >= last:
        i += 1
    e["_last"] = i
    return options[i]


# Each event: (fields drawn by _draw, renderers). A renderer takes (event, rng) and returns one
# clause; "neg" flips polarity, "up" direction. Passive and active forms keep roles straight.
def _acquire(e: dict, rng: random.Random) -> str:
    a, b, m = e["a"], e["b"], _money(e, rng)
    if e["neg"]:
        return _pick(e, rng, (f"{a} did not acquire {b}, walking away from a {m} offer",
                           f"{a} called off its {m} bid for {b}", f"{b} was not bought by {a}, which had offered {m}",
                           f"{a} abandoned a {m} deal to buy {b}"))
    return _pick(e, rng, (f"{a} acquired {b} for {m}", f"{a} bought {b} in a deal worth {m}",
                       f"{b} was acquired by {a} for {m}", f"{b} was bought by {a} for {m}",
                       f"{a} agreed to purchase {b} for {m}", f"{a} completed its {m} takeover of {b}"))


def _sue(e: dict, rng: random.Random) -> str:
    a, b, c = e["p"], e["b"], e["court"]
    if e["neg"]:
        return _pick(e, rng, (f"{a} dropped a lawsuit against {b} in {c}", f"{a} decided not to sue {b} in {c}",
                           f"{b} will not be sued by {a} after all, {a}'s lawyers told {c}"))
    return _pick(e, rng, (f"{a} sued {b} in {c}", f"{a} filed a lawsuit against {b} in {c}",
                       f"{b} was sued by {a} in {c}", f"{b} is being taken to {c} by {a}",
                       f"{a} has taken {b} to {c}"))


def _shares(e: dict, rng: random.Random) -> str:
    a, p, d = e["a"], _pct(e, rng), e["day"]
    if e["up"]:
        return _pick(e, rng, (f"shares of {a} rose {p} on {d}", f"{a}'s stock climbed {p} on {d}",
                           f"on {d}, {a} shares gained {p}", f"{a} stock jumped {p} in trading on {d}"))
    return _pick(e, rng, (f"shares of {a} fell {p} on {d}", f"{a}'s stock dropped {p} on {d}",
                       f"on {d}, {a} shares lost {p}", f"{a} stock slid {p} in trading on {d}"))


def _jobs(e: dict, rng: random.Random) -> str:
    a, n, c = e["a"], _num(e["n"] * 10, rng), e["city"]
    if e["up"]:
        return _pick(e, rng, (f"{a} will hire {n} workers at its {c} plant", f"{a} plans to add {n} jobs in {c}",
                           f"{n} new jobs are coming to {a}'s {c} site", f"{a} is creating {n} positions in {c}"))
    return _pick(e, rng, (f"{a} will cut {n} jobs at its {c} plant", f"{a} plans to lay off {n} workers in {c}",
                       f"{n} jobs will be eliminated at {a}'s {c} site", f"{a} is shedding {n} positions in {c}"))


def _defeat(e: dict, rng: random.Random) -> str:
    a, b, n, c = e["p"], e["q"], _num(e["n"] * 10 + 7, rng), e["city"]
    if e["up"]:  # a won
        return _pick(e, rng, (f"{a} defeated {b} by {n} votes in the {c} mayoral race",
                              f"{a} beat {b} by a margin of {n} votes to become mayor of {c}",
                              f"{a} won the {c} mayoral race, finishing {n} votes ahead of {b}",
                              f"in {c}, {a} was elected mayor, beating {b} by {n} votes"))
    return _pick(e, rng, (f"{a} lost the {c} mayoral race to {b} by {n} votes",
                          f"{a} was defeated by {b} by a margin of {n} votes in the race for mayor of {c}",
                          f"{a} conceded the {c} mayoral race, finishing {n} votes behind {b}",
                          f"in {c}, {a} failed to become mayor, losing to {b} by {n} votes"))


def _vote(e: dict, rng: random.Random) -> str:
    body, plan, y, n = e["body"], e["plan"], _num(e["n"] + 3, rng), _num(e["n"] % 3, rng)
    if e["up"]:
        return _pick(e, rng, (f"{body} approved the {plan} by a vote of {y} to {n}",
                           f"the {plan} was approved by {body}, {y} votes to {n}",
                           f"{body} voted {y} to {n} in favor of the {plan}",
                           f"{body} passed the {plan}, with {y} members for and {n} against"))
    return _pick(e, rng, (f"{body} rejected the {plan} by a vote of {y} to {n}",
                       f"the {plan} was voted down by {body}, {y} votes to {n}",
                       f"{body} voted {y} to {n} against the {plan}",
                       f"{body} turned down the {plan}, with {y} members against and {n} for"))


# Background facts carry no direction or polarity of their own (no rose/fell, won/lost), so the one
# fact a negative changes stands out; they are reworded like the main event and never changed.
_BACKGROUND = (
    ("{a} has offices in {city} and employs about {n}00 people there",
     "about {n}00 people work for {a} at its offices in {city}",
     "{a}, which has about {n}00 staff in {city}, has offices there"),
    ("the news was first reported by a local newspaper in {city} on {day}",
     "a {city} newspaper was the first to report the news on {day}",
     "on {day}, a local paper in {city} first reported the news"),
    ("{p} is expected to brief reporters in {city} later this week",
     "reporters in {city} expect a briefing from {p} later this week",
     "later this week {p} is due to speak to the press in {city}"),
    ("{body} will meet again on {day} to discuss the {plan}",
     "the {plan} is on the agenda when {body} meets again on {day}",
     "on {day}, {body} is scheduled to meet again about the {plan}"),
    ("{a} was founded in {city} more than {n} years ago",
     "more than {n} years ago, {a} was set up in {city}",
     "{a} started out in {city} over {n} years ago"),
    ("{p} has worked in {city} for {n} years",
     "for {n} years, {p} has been based in {city}",
     "{p} has spent {n} years working in {city}"),
    ("{a} and {b} both have headquarters in {city}",
     "the headquarters of {a} and {b} are both in {city}",
     "{city} is home to the head offices of both {a} and {b}"),
    ("the announcement was made at a press conference in {city} on {day}",
     "on {day}, the news was announced at a press conference in {city}",
     "a press conference in {city} on {day} was where the announcement came"),
)


def _background(e: dict, rng: random.Random) -> str:
    return _pick(e, rng, _BACKGROUND[e["fact"]]).format(**e)


_EVENTS = ((_acquire, "ab m neg"), (_sue, "pb court neg"), (_shares, "a n day up"), (_jobs, "a n city up"),
           (_defeat, "pq n city up"), (_vote, "body plan n up"))


def _draw(rng: random.Random) -> dict:
    kind, fields = rng.choice(_EVENTS)
    a, b = rng.sample(_FIRMS, 2)
    p, q = rng.sample(_PEOPLE, 2)
    return {"kind": kind, "fields": fields, "a": a, "b": b, "p": p, "q": q, "m": rng.randint(5, 400),
            "n": rng.randint(2, 40), "day": rng.choice(_DAYS), "city": rng.choice(_CITIES),
            "court": rng.choice(_COURTS), "body": rng.choice(_BODIES), "plan": rng.choice(_PLANS),
            "neg": rng.random() < 0.3, "up": rng.random() < 0.7}


def _draw_background(rng: random.Random) -> dict:
    e = _draw(rng)
    e.update(kind=_background, fields="", fact=rng.randrange(len(_BACKGROUND)))
    return e


def _perturb(e: dict, rng: random.Random) -> dict:
    """The same event with exactly one fact changed."""
    f, e = e["fields"].split(), dict(e)
    # Direction and polarity flips dominate: opposite words (rose/fell, approved/rejected) that the
    # pretrained model already tells apart but that, among different wordings on both sides, a linear
    # bag of words cannot. A number changes only where both sides always spell it differently
    # ("$3.5 million" / "3.5 million dollars", "12%" / "12 percent"), so a bag of words never sees the
    # same number token on both sides. (Role swaps, which need alignment across the pair, are not
    # learnable in one epoch at this size and are left out.)
    options = ["num"] * (e["kind"] in (_acquire, _shares)) + ["neg"] * 8 * ("neg" in f) + ["up"] * 8 * ("up" in f)
    what = rng.choice(options)
    if what == "num":
        key = "m" if "m" in f else "n"
        step = rng.randint(1, max(2, e[key] // 2))
        e[key] = e[key] + step if rng.random() < 0.5 or e[key] - step < 1 else e[key] - step
    else:
        e[what] = not e[what]
    return e


_ATTRIBUTION = ("{p} said", "{p}, a spokesperson for {a}, said", "{p} told reporters on {day}",
                "{p} said in a statement on {day}")
_LINKS = {  # connector type -> ways to say it; the type, not the wording, is part of the meaning
    "after": (", a week after {x}", ", seven days after {x}", ", one week after {x}"),
    "also": ("; separately, {x}", ". In other news, {x}", ". Meanwhile, {x}", ", while {x}"),
    "because": (", because {x}", ", a move that came because {x}", ", partly because {x}"),
}


def _story(rng: random.Random) -> dict:
    """What a sentence says: a main event, maybe an attribution and background events."""
    k = 0
    while rng.random() < (0.3 if k == 0 else 0.35) and k < 6:  # a geometric tail of background events
        k += 1
    return {"main": _draw(rng), "said": _draw(rng) if rng.random() < 0.25 else None,
            "said_as": rng.randrange(len(_ATTRIBUTION)),
            "more": [(rng.choice(tuple(_LINKS)), _draw_background(rng)) for _ in range(k)]}


def _render(story: dict, rng: random.Random) -> str:
    main = story["main"]["kind"](story["main"], rng)
    if story["said"] is not None:
        who = _ATTRIBUTION[story["said_as"]].format(**story["said"])
        main = rng.choice((f"{who} that {main}", f"{main}, {who}"))
    for link, event in story["more"]:
        main += rng.choice(_LINKS[link]).format(x=event["kind"](event, rng))
    return main[0].upper() + main[1:] + "."


def _perturb_story(story: dict, rng: random.Random) -> dict:
    """The story with one fact of its main event changed; background clauses never change."""
    if story["more"]:
        rng.random()  # a draw kept from an earlier version, so the measured data set stays the same
    return dict(story, main=_perturb(story["main"], rng))


def paraphrase_dataset(split: str, n: int | None = None, seed: int = 0) -> ClassificationData:
    """Balanced sentence-pair paraphrase detection; train defaults to 3000 pairs, eval to 600."""
    n = split_size("paraphrase", split, n, 3000, 600)
    rng = random.Random(f"corecpu-paraphrase-{seed}-{split}")
    firsts: list[str] = []
    seconds: list[str] = []
    labels: list[int] = []
    seen: set[str] = set()
    while len(firsts) < n:
        order = [0, 1]
        rng.shuffle(order)
        for lab in order:
            while True:
                story = _story(rng)
                first = _render(story, rng)
                if first not in seen and split_of(first) == split:
                    break
            other = story if lab else _perturb_story(story, rng)
            second = _render(other, rng)
            for _ in range(3):  # a paraphrase should be reworded, not copied (short stories may not allow it)
                if second != first:
                    break
                second = _render(other, rng)
            seen.add(first)
            firsts.append(first)
            seconds.append(second)
            labels.append(lab)
    return ClassificationData(firsts[:n], seconds[:n], labels[:n], list(PARAPHRASE_LABELS),
                              f"paraphrase:{split}(seed={seed})")


# ---------------------------------------------------------------- registry, files, statistics

TASKS: dict[str, Callable[..., ClassificationData]] = {"builtin": builtin_dataset, "paraphrase": paraphrase_dataset}


def task_dataset(name: str, split: str, n: int | None = None, seed: int = 0) -> ClassificationData:
    if name not in TASKS:
        raise CoreCPUError(f"unknown built-in task {name!r}; use one of: {', '.join(TASKS)}")
    return TASKS[name](split, n=n, seed=seed)


def write_task(path: str | Path, task: str = "builtin", split: str = "train", n: int | None = None,
               seed: int = 0) -> int:
    """Write a task split as TSV with header `sentence<TAB>label` (`sentence1<TAB>sentence2<TAB>label`
    for pairs), which load_file reads back as the same examples; returns the row count."""
    path = Path(path)
    if not path.parent.is_dir():
        raise CoreCPUError(f"cannot write '{path}': directory '{path.parent}' does not exist; create it first")
    data = task_dataset(task, split, n=n, seed=seed)
    with path.open("w", encoding="utf-8", newline="") as fh:
        if data.text_pairs is None:
            fh.write("sentence\tlabel\n")
            fh.writelines(f"{t}\t{data.label_names[lab]}\n" for t, lab in zip(data.texts, data.labels))
        else:
            fh.write("sentence1\tsentence2\tlabel\n")
            fh.writelines(f"{a}\t{b}\t{data.label_names[lab]}\n"
                          for a, b, lab in zip(data.texts, data.text_pairs, data.labels))
    return len(data)


def write_builtin(path: str | Path, split: str = "train", n: int | None = None, seed: int = 0) -> int:
    """Write the builtin sentiment split as a TSV with header `sentence<TAB>label`; returns the row count."""
    return write_task(path, "builtin", split, n, seed)


@dataclass(frozen=True)
class LengthStats:
    count: int
    mean: float
    median: float
    p95: int
    min: int
    max: int
    truncated_pct: float  # examples longer than max_len, which tokenization truncates
    histogram: tuple[tuple[str, int], ...]  # ("1-16", count), ..., ("129+", count)


def length_stats(lengths: Sequence[int], max_len: int = 128, bin_width: int = 16) -> LengthStats:
    """Summary and histogram of untruncated token lengths: bins of bin_width up to max_len, then one open bin."""
    if not lengths:
        raise CoreCPUError("no lengths to summarize: the dataset is empty")
    ordered = sorted(lengths)
    bins = [(f"{lo + 1}-{min(lo + bin_width, max_len)}", sum(lo < x <= min(lo + bin_width, max_len) for x in ordered))
            for lo in range(0, max_len, bin_width)]
    over = sum(x > max_len for x in ordered)
    bins.append((f"{max_len + 1}+", over))
    p95 = ordered[math.ceil(0.95 * len(ordered)) - 1]  # nearest-rank percentile
    return LengthStats(len(ordered), statistics.fmean(ordered), statistics.median(ordered), p95, ordered[0],
                       ordered[-1], 100 * over / len(ordered), tuple(bins))


def format_length_stats(stats: LengthStats, width: int = 40) -> str:
    """A Markdown table with ASCII bars, then one line of summary figures."""
    top = max(c for _, c in stats.histogram) or 1
    rows = ["| tokens | examples | |", "|---:|---:|:---|"]
    rows += [f"| {label} | {count} | `{'#' * round(width * count / top)}` |" for label, count in stats.histogram]
    rows += ["", f"{stats.count} examples: mean {stats.mean:.1f}, median {stats.median:g}, p95 {stats.p95}, "
             f"min {stats.min}, max {stats.max} tokens; {stats.truncated_pct:.1f}% over the limit (truncated)."]
    return "\n".join(rows)


def task_lengths(name: str, split: str, tokenizer, n: int | None = None, seed: int = 0) -> list[int]:  # noqa: ANN001
    """Untruncated token counts per example, special tokens included (pairs encoded as pairs)."""
    data = task_dataset(name, split, n=n, seed=seed)
    return [len(ids) for ids in tokenizer(data.texts, data.text_pairs, truncation=False)["input_ids"]]
