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

    uv run python examples/rag_agent/baselines.py [--data MUSIQUE_DIR]
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from data import Question, load_split, write_bundled  # noqa: E402
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
