"""Trivial policies on the RAG agent's held-out set: what a score means only beside these.

Each policy answers every held-out question without searching, and is scored with the agent's
own scoring, :func:`reward.scores` (exact match and answer F1, SQuAD normalisation, any alias):

- ``constant``: the answer of the prompt's first worked example (``Harrowgate``), what a model
  that copies its few-shot prompt says;
- ``format_only``: a well-formed ``<answer>unknown</answer>``;
- ``most_frequent``: the held-out set's own most frequent gold answer (an upper bound for any
  policy that always gives the same answer);
- ``generic_word``: ``University`` when the question mentions a university, else ``City``
  (the rule that scored F1 0.649 on the earlier data, whose answers had those words);
- ``question_copy``: the question itself as the answer (token F1 pays for any shared word).

Rule-based solvers read the question (:func:`rule_scores`):

- ``bm25_top2_regex``: the agent's own search (:class:`retrieval.SearchIndex`, SQLite FTS5
  BM25 over the train and dev paragraphs) with the question as the query, its top 2 paragraphs
  (the agent's ``TOP_K``), then one regular expression: ``born in X`` for a city question,
  ``studied at X`` for a university question -- no model;
- ``constant_per_type``: the held-out set's most frequent city for city questions and most
  frequent university for university questions.

    uv run python examples/rag_agent/baselines.py [--data MUSIQUE_DIR]
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from data import Question, corpus, load_split, write_bundled  # noqa: E402
from retrieval import SearchIndex, build_index  # noqa: E402
from reward import scores  # noqa: E402

DEFAULT_DATA = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "agentbolt/examples/rag_agent/data"
FEW_SHOT_ANSWER = "Harrowgate"
"""The first worked example's answer in ``agent.FEW_SHOT`` (not imported: agent.py needs the Agents SDK)."""


def _answers(q: Question) -> list[str]:
    return [q.answer, *q.answer_aliases]


def policies(dev: list[Question]) -> dict[str, Callable[[Question], str]]:
    """The trivial policies, each a function from a question to the agent's final reply."""
    frequent = Counter(q.answer for q in dev).most_common(1)[0][0]
    return {
        "constant": lambda q: f"<answer>{FEW_SHOT_ANSWER}</answer>",
        "format_only": lambda q: "<answer>unknown</answer>",
        "most_frequent": lambda q: f"<answer>{frequent}</answer>",
        "generic_word": lambda q: f"<answer>{'University' if 'university' in q.question.lower() else 'City'}</answer>",
        "question_copy": lambda q: f"<answer>{q.question}</answer>",
    }


BUNDLED_DATA_MEASURES = (
    "Every bundled question is one of two templates (the city or the university of a work's author, "
    "director or founder): a BM25 search with the question and one regular expression on its top two "
    "paragraphs answer most of them, so the dev set measures whether the model learns to search and "
    "copy the right name, not open-domain multi-hop reasoning."
)
"""One sentence on what the bundled dev set measures (printed with the figures)."""

TOP_K = 2
"""Paragraphs the agent's ``search`` returns (``agent.TOP_K``; not imported: agent.py needs the Agents SDK)."""

_FACT = {"city": re.compile(r"was born in (\w+)"), "university": re.compile(r"studied at (\w+)")}


def _kind(q: Question) -> str:
    return "university" if "university" in q.question.lower() else "city"


def bm25_regex(index: SearchIndex, q: Question) -> str:
    """Search with the question, read the fact the question asks for in the top paragraphs."""
    for hit in index.search(q.question, k=TOP_K):
        m = _FACT[_kind(q)].search(hit.text)
        if m:
            return f"<answer>{m.group(1)}</answer>"
    return "<answer>unknown</answer>"


def rule_scores(data_dir: Path | None = None) -> list[dict[str, Any]]:
    """The rule-based solvers' rows on the dev set (same keys as :func:`trivial_scores`)."""
    folder = Path(data_dir) if data_dir else write_bundled(DEFAULT_DATA)
    train, dev = load_split(folder, "train"), load_split(folder, "dev")
    frequent = {
        kind: Counter(q.answer for q in dev if _kind(q) == kind).most_common(1)[0][0]
        for kind in {_kind(q) for q in dev}
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        index_path = Path(tmp) / "index.fts5.sqlite"
        build_index(corpus([*train, *dev]), index_path)  # what train.py indexes: train and dev paragraphs
        index = SearchIndex(index_path)
        replies = {
            "bm25_top2_regex": [bm25_regex(index, q) for q in dev],
            "constant_per_type": [f"<answer>{frequent[_kind(q)]}</answer>" for q in dev],
        }
    for policy, answers in replies.items():
        results = [scores(reply, _answers(q)) for reply, q in zip(answers, dev, strict=True)]
        for metric in ("exact_match", "f1"):
            value = sum(r[metric] for r in results) / len(results)
            rows.append({"heldout": "dev", "policy": policy, "metric": metric, "score": value, "n": len(dev)})
    return rows


def trivial_scores(data_dir: Path | None = None) -> list[dict[str, Any]]:
    """One row per (policy, metric) on the dev set: ``heldout``, ``policy``, ``metric``, ``score``, ``n``."""
    folder = Path(data_dir) if data_dir else write_bundled(DEFAULT_DATA)
    dev = load_split(folder, "dev")
    rows = []
    for policy, reply in policies(dev).items():
        results = [scores(reply(q), _answers(q)) for q in dev]
        for metric in ("exact_match", "f1"):
            value = sum(r[metric] for r in results) / len(results)
            rows.append({"heldout": "dev", "policy": policy, "metric": metric, "score": value, "n": len(dev)})
    return rows


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=None, help="a MuSiQue data folder (default: the bundled set)")
    args = p.parse_args(argv)
    for row in trivial_scores(args.data):
        print(f"{row['heldout']:<6} {row['policy']:<14} {row['metric']:<12} {row['score']:.3f} (n={row['n']})")
    for row in rule_scores(args.data):
        print(f"{row['heldout']:<6} {row['policy']:<14} {row['metric']:<12} {row['score']:.3f} (n={row['n']}, rule)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
