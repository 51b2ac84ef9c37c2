"""A generated extractive QA set (SQuAD-style) that needs no download: `builtin_qa_dataset(split)`.

Each context is a short report about invented people and places (so a pretrained model knows
none of the answers), with SQuAD-like lengths: median about 170 tokens (all-MiniLM-L6-v2 / BERT
uncased), mean about 190, and about 6% past 370 tokens, so that doc-stride windows get exercised. Questions ask for one fact about
one person; the context also states the same kind of fact about others, often in a sentence
that names the person asked about ("Maria Lopez's cousin, Hugo Varga, was born in Velmora in
1968") while the person's own fact calls them "she" or "Lopez", so the sentence that shares
most words with the question holds the answer only about half the time. With `with_impossible`, about 10% of the questions
have no answer (SQuAD v2.0): a fact the context gives for others but not for this person, or a
person who is not in the context at all.

A content hash of the context, not the random stream, assigns contexts to splits (as for the
classification tasks), so train and eval never share one whatever n or seed. Torch-free.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from corecpu.data.builtin import split_of, split_size
from corecpu.data.qa import QAData, QAExample

_FEMALE = ("Maria", "Aisha", "Elena", "Sofia", "Laura", "Grace", "Fatima", "Hannah", "Ingrid", "Nadia", "Chloe",
           "Yara", "Mei", "Amara", "Leila", "Petra", "Rosa", "Selin", "Tove", "Zainab", "Olga", "Clara", "Noor",
           "Ines")
_MALE = ("James", "Robert", "Tomasz", "David", "Kenji", "Omar", "Daniel", "Lucas", "Victor", "Mateo", "Arjun",
         "Felix", "Henrik", "Jonas", "Kwame", "Luca", "Milan", "Nikolai", "Pablo", "Ravi", "Samir", "Teodor", "Emil",
         "Hugo")
_SURNAMES = ("Lopez", "Varga", "Okonkwo", "Lindqvist", "Moreau", "Castellano", "Brandt", "Novak", "Haddad",
             "Kowalczyk", "Tanaka", "Marchetti", "Fischer", "Duarte", "Sorensen", "Abara", "Whitlock", "Petrov",
             "Nakamura", "Quintero", "Halloran", "Bergstrom", "Achterberg", "Osei", "Rinaldi", "Vasquez", "Ibsen",
             "Karlsson", "Delacroix", "Ferreira", "Mbeki", "Oyelaran", "Kaminski", "Holt", "Sandoval", "Ardent",
             "Larkspur", "Thorne", "Valdez", "Eriksen")
_PLACES = ("Karnholm", "Velmora", "Oskarsby", "Duneport", "Halvik", "Tarrow", "Eastmere", "Kellingford",
           "Brightwater", "Marrowgate", "Solvenna", "Ardley", "Fenwick", "Cordova Bay", "Isterby", "Lunmouth",
           "Pellston", "Ravensholt", "Quarry Hill", "Westerlo", "Ambergate", "Norrvik")
_RIVERS = ("Ostra", "Veld", "Marrow", "Kessel", "Lune", "Tamsin", "Orrin", "Bellow", "Sable", "Wend")
_JOBS = ("marine biologist", "architect", "pastry chef", "civil engineer", "translator", "veterinarian",
         "jazz pianist", "tax lawyer", "geologist", "nurse", "airline pilot", "furniture maker", "data analyst",
         "beekeeper", "court reporter", "set designer", "museum curator", "structural engineer")
_ORGS = ("Copperleaf Analytics", "Bluefen Shipping", "Northgate Hospital", "Halden Robotics", "Saltmarsh Bakery",
         "Orrery Studios", "Greywater Legal", "Kestrel Airways", "Ironwood Furniture", "the Velmora Orchestra",
         "Tidewell Clinic", "Lantern Press", "Brackwater Survey", "Eastmere Theatre", "Quillon Bank",
         "Redfern Museum")
_SUBJECTS = ("medieval history", "chemical engineering", "linguistics", "economics", "astrophysics", "agronomy",
             "philosophy", "graphic design", "marine ecology", "music theory", "civil law", "geography")
_SCHOOLS = ("University of {p}", "{p} Institute of Technology", "{p} College of Art", "{p} School of Law")
_COMPANIES = ("Fjordline", "Brightloom", "Cinderpath", "Mossgate", "Harrowfield", "Sundial Works", "Quietwater",
              "Redkite Labs", "Oakhollow", "Silverthread", "Emberline", "Northwick Foods", "Pale Fox Games",
              "Tern Aviation", "Glasshouse Media", "Lowmoor Dairy", "Cobalt Ferries", "Wrenfield Textiles")
_ADJS = ("Silent", "Glass", "Hollow", "Last", "Winter", "Painted", "Broken", "Hidden", "Salt", "Paper", "Quiet",
         "Iron")
_NOUNS = ("Orchard", "Lighthouse", "Harbour", "Garden", "Letters", "Bridge", "Ferryman", "Clockmaker", "Island",
          "Season", "Archive", "Choir")
_TOPICS = ("a lighthouse keeper's family", "the history of salt", "two rival bakers", "a flooded village",
           "an old ferry", "a missing painting", "life on a fishing boat", "a travelling circus",
           "a failed expedition", "a small-town election")
_PRIZES = ("{p} Prize", "{s} Medal", "{p} Award for Design", "{s} Fellowship")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")
_RELATIONS = ("cousin", "business partner", "neighbour", "oldest friend", "former teacher", "colleague", "flatmate",
              "co-author")
_NUMBER_WORDS = ("two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")

# Fact kinds: (sentences about a profiled person {P}, clause said of a relative or None,
# questions as (template, answer slot)). {Poss} is the possessive of {P}. The first question
# names only the person: it is the one asked of people the context says nothing of that kind about.
_FACTS: dict[str, tuple[tuple[str, ...], str | None, tuple[tuple[str, str], ...]]] = {
    "born": (("{P} was born in {city} in {year}.", "{P} was born in {year} in the town of {city}.",
              "{P} grew up in {city}, having been born there in {year}."),
             "was born in {city} in {year}",
             (("In what year was {name} born?", "year"), ("When was {name} born?", "year"),
              ("Where was {name} born?", "city"), ("In which town was {name} born?", "city"))),
    "job": (("{P} works as a {job} for {org}.", "{P} is employed by {org} as a {job}.",
             "These days {P} is a {job} at {org}."),
            "works as a {job} for {org}",
            (("What is {name}'s job?", "job"), ("What does {name} do for a living?", "job"),
             ("Which organisation employs {name}?", "org"), ("Who does {name} work for?", "org"))),
    "study": (("{P} studied {subject} at the {school}.", "{P} holds a degree in {subject} from the {school}."),
              "studied {subject} at the {school}",
              (("What did {name} study?", "subject"), ("Which school did {name} attend?", "school"))),
    "found": (("In {year}, {P} founded {company}, which now employs {count} people.",
               "{P} started {company} in {year}; the firm has {count} employees today."),
              None,
              (("What company did {name} found?", "company"), ("In what year did {name} found {company}?", "year"),
               ("How many people does {company} employ?", "count"))),
    "book": (("{P} wrote {title}, a novel about {topic}.", "{P} is the author of {title}, a book about {topic}.",
              "{Poss} first book, {title}, tells the story of {topic}."),
             None,
             (("What is the title of {name}'s book?", "title"), ("Which book did {name} write?", "title"),
              ("What is the book by {name} about?", "topic"))),
    "move": (("In {when}, {P} moved to {city}.", "{P} moved to {city} in {when}.",
              "{P} settled in {city} in {when}."),
             "moved to {city} in {when}",
             (("Where did {name} move to?", "city"), ("When did {name} move to {city}?", "when"),
              ("Where did {name} move in {when}?", "city"))),
    "prize": (("{P} won the {prize} in {year}.", "In {year}, {P} received the {prize}."),
              "won the {prize} in {year}",
              (("Which award did {name} win?", "prize"), ("When did {name} win the {prize}?", "year"))),
    "marathons": (("{P} has run {small} marathons.", "So far {P} has finished {small} marathons."), None,
                  (("How many marathons has {name} run?", "small"),)),
    "bees": (("{P} keeps {small} beehives behind the house.",), None,
             (("How many beehives does {name} keep?", "small"),)),
}
_PLACE_FACT = (("{place} lies on the {river} and has about {count} inhabitants.",
                "About {count} people live in {place}, a town on the {river}."),
               (("On which river does {place} lie?", "river"), ("How many people live in {place}?", "count")))
_FILLER = ("The report was compiled from interviews and public records.", "Several details could not be confirmed.",
           "Local newspapers covered some of these events at the time.", "The figures below are approximate.")
_SLOT = re.compile(r"\{(\w+)\}")
_PEOPLE, _PEOPLE_WEIGHTS = (1, 2, 3, 4, 5, 6), (35, 38, 14, 6, 4, 3)


def _fill(template: str, values: dict[str, str]) -> tuple[str, dict[str, tuple[int, str]]]:
    """The sentence and where each slot's value landed in it: {slot: (offset, text)}."""
    out, spans, pos = [], {}, 0
    for m in _SLOT.finditer(template):
        out.append(template[pos:m.start()])
        text = values[m.group(1)]
        spans[m.group(1)] = (sum(map(len, out)), text)
        out.append(text)
        pos = m.end()
    out.append(template[pos:])
    sentence = "".join(out)
    return sentence[0].upper() + sentence[1:], spans


def _number(rng: random.Random, lo: int, hi: int) -> str:
    return f"{rng.randint(lo, hi):,}"


_MAKERS: dict[str, Callable[[random.Random], str]] = {
    "city": lambda rng: rng.choice(_PLACES), "year": lambda rng: str(rng.randint(1931, 2019)),
    "job": lambda rng: rng.choice(_JOBS), "org": lambda rng: rng.choice(_ORGS),
    "subject": lambda rng: rng.choice(_SUBJECTS),
    "school": lambda rng: rng.choice(_SCHOOLS).format(p=rng.choice(_PLACES)),
    "company": lambda rng: rng.choice(_COMPANIES), "count": lambda rng: _number(rng, 12, 4800),
    "title": lambda rng: f"The {rng.choice(_ADJS)} {rng.choice(_NOUNS)}", "topic": lambda rng: rng.choice(_TOPICS),
    "when": lambda rng: f"{rng.choice(_MONTHS)} {rng.randint(1950, 2021)}",
    "prize": lambda rng: rng.choice(_PRIZES).format(p=rng.choice(_PLACES), s=rng.choice(_SURNAMES)),
    "small": lambda rng: rng.choice(_NUMBER_WORDS) if rng.random() < 0.5 else str(rng.randint(13, 60)),
}
_UNIQUE = ("company", "title", "prize")  # named in questions, so one value names one fact in a context
# The slots each kind of fact needs, in a fixed order (the random stream must not depend on set order).
_SLOTS = {kind: [s for s in _MAKERS if any("{" + s + "}" in t for t in (*sents, clause or "", *(q for q, _ in qs)))]
          for kind, (sents, clause, qs) in _FACTS.items()}


def _values(kind: str, rng: random.Random, used: dict[str, list[str]]) -> dict[str, str]:
    """Slot values for one fact; companies, titles and prizes are never repeated within a context."""
    values = {}
    for slot in _SLOTS[kind]:
        value = _MAKERS[slot](rng)
        for _ in range(20 if slot in _UNIQUE else 0):
            if value not in used.setdefault(slot, []):
                break
            value = _MAKERS[slot](rng)
        used.setdefault(slot, []).append(value)
        values[slot] = value
    return values


def _context(rng: random.Random) -> tuple[str, list[tuple[str, tuple[int, str]]], list[str]]:
    """One context, its answerable questions with (answer offset, answer text), and questions
    it has no answer to; the caller picks which to ask."""
    # Mostly one to three people (SQuAD-like lengths: median about 130 tokens), now and then five or
    # six, whose contexts run past 384 tokens and need a second window.
    people = rng.sample([(f, "f") for f in _FEMALE] + [(m, "m") for m in _MALE], rng.choices(_PEOPLE, _PEOPLE_WEIGHTS)[0])
    surnames = rng.sample(_SURNAMES, len(_SURNAMES))  # unique in a context: a surname names one person
    used: dict[str, list[str]] = {}
    sentences: list[str] = []
    answerable: list[tuple[str, tuple[int, str]]] = []
    kinds_of: dict[str, list[str]] = {}
    offset = 0

    def add(template: str, values: dict[str, str]) -> dict[str, tuple[int, str]]:
        nonlocal offset
        sentence, spans = _fill(template, values)
        sentences.append(sentence)
        spans = {k: (offset + o, t) for k, (o, t) in spans.items()}
        offset += len(sentence) + 1  # the joining space
        return spans

    if rng.random() < 0.3:
        add(rng.choice(_FILLER), {})
    extra = iter(surnames[len(people):])
    for (first, sex), surname in zip(people, surnames):
        name = f"{first} {surname}"
        kinds = rng.sample(list(_FACTS), rng.randint(3, 6))
        kinds_of[name] = kinds
        relations = rng.sample(_RELATIONS, len(_RELATIONS))  # each relation once per person
        # The full name once; then a pronoun, or the surname where a pronoun could mean a relative.
        refs = ((name, name + "'s"), (surname, surname + "'s"), ("she", "her") if sex == "f" else ("he", "his"))
        ref = 0
        for kind in kinds:
            sentences_t, clause, questions = _FACTS[kind]
            values = _values(kind, rng, used)
            spans = add(rng.choice(sentences_t), dict(values, P=refs[ref][0], Poss=refs[ref][1]))
            ref = rng.choice((1, 2, 2))
            for q, slot in questions:
                answerable.append((q.format(name=name, **values), spans[slot]))
            if clause is not None and rng.random() < 0.4:  # a relative with the same kind of fact
                relative, relation = f"{rng.choice(_FEMALE + _MALE)} {next(extra)}", relations.pop()
                rel_values = _values(kind, rng, used)
                spans = add(f"{name}'s {relation}, {{rname}}, {clause}.", dict(rel_values, rname=relative))
                answerable.append((f"Who is {name}'s {relation}?", spans["rname"]))
                q, slot = rng.choice(questions)
                answerable.append((q.format(name=relative, **rel_values), spans[slot]))
                ref = 1
    for place in rng.sample(_PLACES, rng.randint(0, 2)):
        values = {"place": place, "river": f"{rng.choice(_RIVERS)} River", "count": _number(rng, 800, 90000)}
        spans = add(rng.choice(_PLACE_FACT[0]), values)
        for q, slot in _PLACE_FACT[1]:
            answerable.append((q.format(**values), spans[slot]))
    context = " ".join(sentences)
    # Unanswerable: a kind of fact others have but this person lacks, or a stranger with a known first name.
    impossible = []
    for name, kinds in kinds_of.items():
        for kind in [k for k in _FACTS if k not in kinds and any(k in ks for ks in kinds_of.values())]:
            impossible.append(_FACTS[kind][2][0][0].format(name=name))
    stranger = f"{people[0][0]} {next(extra)}"
    impossible += [_FACTS[kind][2][0][0].format(name=stranger) for kind in ("born", "job", "study")]
    return context, answerable, impossible


def builtin_qa_dataset(split: str, n: int | None = None, seed: int = 0, *, with_impossible: bool = False) -> QAData:
    """The generated QA split: train defaults to 2000 questions, eval to 400; deterministic in (split, n, seed).

    With `with_impossible` about 10% of the questions are unanswerable (SQuAD v2.0 style).
    """
    n = split_size("builtin-qa", split, n, 2000, 400)
    rng = random.Random(f"corecpu-builtin-qa-{seed}-{split}-{int(with_impossible)}")
    examples: list[QAExample] = []
    seen: set[str] = set()
    while len(examples) < n:
        context, answerable, impossible = _context(rng)
        if context in seen or split_of(context) != split:
            continue
        seen.add(context)
        asked: list[tuple[str, tuple[int, str] | None]] = []
        for q, answer in rng.sample(answerable, min(len(answerable), rng.randint(3, 6))):
            # 0.11 extra per answerable question: 0.11 / 1.11, about 10% of all, are unanswerable.
            if with_impossible and impossible and rng.random() < 0.11:
                asked.append((impossible.pop(rng.randrange(len(impossible))), None))
            asked.append((q, answer))
        for q, answer in dict(asked).items():  # one question text once per context
            texts, starts = ((answer[1],), (answer[0],)) if answer else ((), ())
            examples.append(QAExample(f"{split}-{len(examples):05d}", q, context, texts, starts))
    return QAData(examples[:n], f"builtin-qa:{split}(seed={seed}{', v2' if with_impossible else ''})")
