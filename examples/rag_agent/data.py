"""MuSiQue-format data for the RAG example: a generator of the bundled set and the loaders.

Two sources, one code path (:func:`load_split`):

- **bundled**: :func:`write_bundled` generates a small world of fictional people, novels, films,
  companies, cities and universities (so the model cannot know an answer without searching)
  and writes 2-hop questions in MuSiQue's own JSONL layout, ``musique_ans_v1.0_train.jsonl``
  (240 questions) and ``musique_ans_v1.0_dev.jsonl`` (120), into a cache folder. It is
  deterministic: the same files on every machine. Held out by construction: the dev questions'
  people, works, cities and universities occur nowhere in the training file (each split draws
  its own entities and its distractor paragraphs from its own people), and every answer is one
  invented word (a city like ``Norquilzal``, a university like ``Velmorton``): no answer or
  alias holds a generic word such as "City" or "University" that a rule could score with.
- **real**: ``--data PATH`` reads the same two files from the MuSiQue release a user
  downloaded (https://github.com/StonyBrookNLP/musique, ``data.zip``).

A bundled question, e.g. "In which city was the author of The Amber Lantern born?", needs
two facts: who wrote the book (its paragraph) and where that person was born (the person's
paragraph). The person's paragraph also names the book, so one search with the question's
words can reach the answer; a second search on the person's name works too.

Each line is one question: ``id``, ``paragraphs`` ([{``idx``, ``title``, ``paragraph_text``,
``is_supporting``}]), ``question``, ``question_decomposition`` ([{``id``, ``question``,
``answer``, ``paragraph_support_idx``}]), ``answer``, ``answer_aliases``, ``answerable``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

TRAIN_FILE = "musique_ans_v1.0_train.jsonl"
DEV_FILE = "musique_ans_v1.0_dev.jsonl"
MUSIQUE_URL = "https://github.com/StonyBrookNLP/musique"
N_TRAIN = 240
N_DEV = 120
N_PARAGRAPHS = 6
"""Paragraphs per bundled question (2 supporting + 4 distractors; MuSiQue has 20)."""


class DataError(ValueError):
    """A data file is missing or malformed; the message names the file (and line)."""


# -- MuSiQue's record, validated line by line ---------------------------------------------------------


class Paragraph(BaseModel):
    """One paragraph of a question's context."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    idx: int
    title: str
    paragraph_text: str
    is_supporting: bool = False


class DecompositionStep(BaseModel):
    """One hop: a single-hop question, its answer and the paragraph that supports it."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    id: int
    question: str
    answer: str
    paragraph_support_idx: int | None = None


class Question(BaseModel):
    """One line of a ``musique_ans_v1.0_*.jsonl`` file."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    id: str
    paragraphs: list[Paragraph]
    question: str
    question_decomposition: list[DecompositionStep] = []
    answer: str
    answer_aliases: list[str] = []
    answerable: bool = True


def read_jsonl(path: Path) -> list[Question]:
    """Every question of a MuSiQue JSONL file; a bad line raises :class:`DataError` naming file and line."""
    if not path.is_file():
        raise DataError(
            f"MuSiQue file not found: {path}. Download the MuSiQue release from {MUSIQUE_URL} "
            f"(data.zip), unpack it and pass its folder holding {TRAIN_FILE} and {DEV_FILE} with --data."
        )
    questions = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                questions.append(Question.model_validate_json(line))
            except ValidationError as exc:
                problems = "; ".join(
                    f"{'.'.join(str(p) for p in e['loc']) or 'line'}: {e['msg']}" for e in exc.errors()[:3]
                )
                raise DataError(f"{path}:{lineno}: not a MuSiQue question ({problems})") from None
    return questions


def load_split(folder: Path, split: str) -> list[Question]:
    """The answerable questions of ``split`` (``train`` or ``dev``) from a MuSiQue data folder."""
    name = {"train": TRAIN_FILE, "dev": DEV_FILE}.get(split)
    if name is None:
        raise ValueError(f"split must be 'train' or 'dev', got {split!r}")
    return [q for q in read_jsonl(Path(folder) / name) if q.answerable]


def corpus(questions: Iterable[Question]) -> list[tuple[str, str]]:
    """The retrieval corpus: every distinct (title, paragraph text) of the questions, in first-seen order."""
    seen: dict[tuple[str, str], None] = {}
    for q in questions:
        for p in q.paragraphs:
            seen.setdefault((p.title, p.paragraph_text), None)
    return list(seen)


def to_tasks(questions: Iterable[Question], index_path: Path) -> list[dict[str, Any]]:
    """Agent tasks: the question, every accepted answer, and the search index to use."""
    return [
        {
            "task_id": q.id,
            "question": q.question,
            "answers": [q.answer, *q.answer_aliases],
            "index": str(index_path),
        }
        for q in questions
    ]


# -- the bundled world -------------------------------------------------------------------------------

_SYLLABLES = [
    "ka",
    "vel",
    "mor",
    "tha",
    "ri",
    "lo",
    "zen",
    "dra",
    "quil",
    "bar",
    "sen",
    "tor",
    "mi",
    "na",
    "os",
    "ul",
    "fer",
    "gan",
    "bri",
    "co",
    "da",
    "el",
    "fa",
    "ho",
    "ist",
    "ja",
    "ker",
    "lun",
    "mav",
    "nor",
    "pel",
    "ras",
    "sul",
    "tev",
    "var",
    "wen",
    "yor",
    "zal",
]
_UNIVERSITY_ENDINGS = ("ton", "ford", "ham", "wick", "bury", "mouth")
"""Invented university names end like English place names (``Velmorton``): one word, nothing generic."""
N_CITIES = {"train": 60, "dev": 30}
N_UNIVERSITIES = {"train": 24, "dev": 12}
GENERIC_WORDS = frozenset(
    [
        "city",
        "town",
        "university",
        "college",
        "institute",
        "school",
        "academy",
        "port",
        "new",
        "east",
        "west",
        "north",
        "south",
        "lake",
        "fort",
        "river",
        "company",
        "film",
        "novel",
        "the",
        "of",
    ]
)
"""Words a trivial policy could answer without reading (the issue's "City"/"University" rule):
no bundled answer or alias contains one (tested)."""
_ADJECTIVES = [
    "Amber",
    "Silver",
    "Hollow",
    "Silent",
    "Crimson",
    "Distant",
    "Broken",
    "Golden",
    "Quiet",
    "Winter",
    "Iron",
    "Paper",
    "Glass",
    "Northern",
    "Bitter",
    "Velvet",
    "Burning",
    "Hidden",
    "Wandering",
    "Lonely",
]
_NOUNS = [
    "Lantern",
    "Harbor",
    "Garden",
    "Mirror",
    "River",
    "Tower",
    "Orchard",
    "Compass",
    "Bridge",
    "Forest",
    "Letter",
    "Island",
    "Crown",
    "Signal",
    "Engine",
    "Meadow",
    "Voyage",
    "Archive",
    "Window",
    "Storm",
]
_INDUSTRIES = ["Systems", "Foods", "Motors", "Textiles", "Labs", "Shipping", "Energy", "Pharma", "Records", "Optics"]
_KINDS = (
    # kind, role, what the work is, how the person relates to it
    ("novel", "author", "a novel", "wrote"),
    ("film", "director", "a film", "directed"),
    ("company", "founder", "a company", "founded"),
)


def _word(rng: random.Random, parts: int) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(parts)).capitalize()


def _unique(make: Any, taken: set[str]) -> str:
    while True:
        name = make()
        if name not in taken:
            taken.add(name)
            return name


def _world(rng: random.Random, taken: set[str], n_people: int, split: str) -> list[dict[str, str]]:
    """``n_people`` fictional people of one split, each with one work, a birth city and a university.

    ``taken`` holds every name drawn so far (all splits): no person, work, city or university
    is shared between the splits.
    """
    cities = [_unique(lambda: _word(rng, 3), taken) for _ in range(N_CITIES[split])]
    universities = [
        _unique(lambda: _word(rng, 2) + rng.choice(_UNIVERSITY_ENDINGS), taken) for _ in range(N_UNIVERSITIES[split])
    ]
    people = []
    for i in range(n_people):
        kind, role, what, verb = _KINDS[i % len(_KINDS)]
        person = _unique(lambda: f"{_word(rng, 2)} {_word(rng, 2)}", taken)
        if kind == "company":
            work = _unique(lambda: f"{_word(rng, 2)} {rng.choice(_INDUSTRIES)}", taken)
        else:
            work = _unique(lambda: f"The {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}", taken)
        people.append(
            {
                "person": person,
                "kind": kind,
                "role": role,
                "what": what,
                "verb": verb,
                "work": work,
                "year": str(rng.randint(1921, 2019)),
                "city": rng.choice(cities),
                "university": rng.choice(universities),
            }
        )
    return people


def _paragraphs(p: dict[str, str]) -> tuple[tuple[str, str], tuple[str, str]]:
    """The work's paragraph (hop 1) and the person's paragraph (hop 2) as (title, text)."""
    work = (p["work"], f"{p['work']} is {p['what']} from {p['year']}. {p['person']} {p['verb']} it.")
    person = (
        p["person"],
        f"{p['person']} is the {p['role']} of {p['work']}. {p['person']} was born in {p['city']} "
        f"and studied at {p['university']}.",
    )
    return work, person


def _question(p: dict[str, str], attribute: str, qid: str, rng: random.Random, pool: list[dict[str, str]]) -> dict:
    work_par, person_par = _paragraphs(p)
    distractors = []
    for other in rng.sample(pool, N_PARAGRAPHS):
        if other["person"] != p["person"] and len(distractors) < N_PARAGRAPHS - 2:
            distractors.append(rng.choice(_paragraphs(other)))
    contents = [work_par, person_par, *distractors]
    rng.shuffle(contents)
    paragraphs = [
        {"idx": i, "title": title, "paragraph_text": text, "is_supporting": (title, text) in (work_par, person_par)}
        for i, (title, text) in enumerate(contents)
    ]
    hop1 = contents.index(work_par)
    hop2 = contents.index(person_par)
    if attribute == "city":
        question = f"In which city was the {p['role']} of {p['work']} born?"
        step2 = "In which city was #1 born?"
        answer = p["city"]
    else:
        question = f"Which university did the {p['role']} of {p['work']} attend?"
        step2 = "Which university did #1 attend?"
        answer = p["university"]
    return {
        "id": qid,
        "paragraphs": paragraphs,
        "question": question,
        "question_decomposition": [
            {
                "id": 1,
                "question": f"Who is the {p['role']} of {p['work']}?",
                "answer": p["person"],
                "paragraph_support_idx": hop1,
            },
            {"id": 2, "question": step2, "answer": answer, "paragraph_support_idx": hop2},
        ],
        "answer": answer,
        "answer_aliases": [],
        "answerable": True,
    }


def bundled_records(seed: int = 11) -> dict[str, list[dict[str, Any]]]:
    """The bundled questions as MuSiQue records: ``{"train": [...], "dev": [...]}`` (deterministic).

    Each split has its own people (and so its own works), cities and universities; a question's
    distractor paragraphs come from people of the same split.
    """
    rng = random.Random(seed)
    taken: set[str] = set()
    records: dict[str, list[dict[str, Any]]] = {}
    for split, n in (("train", N_TRAIN), ("dev", N_DEV)):
        people = _world(rng, taken, n, split)
        questions = []
        for i, p in enumerate(people):
            attribute = "city" if i % 2 == 0 else "university"
            questions.append(_question(p, attribute, f"2hop__{split}{seed}_{i:04d}", rng, people))
        rng.shuffle(questions)
        records[split] = questions
    return records


def _lines(records: Iterable[dict[str, Any]]) -> Iterator[str]:
    for r in records:
        yield json.dumps(r, ensure_ascii=False) + "\n"


def write_bundled(folder: Path, seed: int = 11) -> Path:
    """Write the bundled train/dev files into ``folder`` (rewritten only when their content differs)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, records in bundled_records(seed).items():
        path = folder / (TRAIN_FILE if split == "train" else DEV_FILE)
        text = "".join(_lines(records))
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(path)
    return folder
