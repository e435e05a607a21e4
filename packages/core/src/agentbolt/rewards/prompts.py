"""The judges' prompts and the parsing of their answers (pure functions).

Two kinds of judgement:

- **rubric** (absolute): one trajectory, a score from 0 to 10 against a rubric; the reward is
  ``score / 10``. The judge answers ``{"score": <0-10>, "reason": "..."}``.
- **ranking** (RULER-style, relative): several trajectories for the same task in one prompt,
  each scored from 0 to 1 *relative to the others* (the best clearly higher than the worst).
  The judge answers ``{"scores": [{"id": 1, "score": 0.8, "reason": "..."}, ...]}``. Comparing
  side by side is easier for a judge than absolute grading, and GRPO only needs differences
  within a group (OpenPipe's RULER).

A parser takes the judge's text and returns the scores or raises :class:`MalformedJudgement`
saying what was wrong; the judge counts those and retries. Parsing is lenient about form (a
JSON object inside prose or a code fence, ``score: 7`` lines) and strict about content (every
trajectory scored once, finite, in range).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from .trajectory import Trajectory

__all__ = [
    "DEFAULT_RUBRIC",
    "MalformedJudgement",
    "Scored",
    "parse_ranking",
    "parse_rubric",
    "ranking_messages",
    "rubric_messages",
]

DEFAULT_RUBRIC = (
    "Judge how well the assistant accomplished what the user asked.\n"
    "- Correct and complete answers score high; wrong, invented or unsupported claims score low.\n"
    "- Following the user's explicit instructions (format, length, language) matters.\n"
    "- Helpfulness counts, verbosity does not: a short correct answer beats a long vague one.\n"
    "- Tool use is judged by its result: errors the assistant recovered from cost a little, "
    "errors it ignored cost a lot."
)

_RUBRIC_SYSTEM = (
    "You are a careful, impartial evaluator of an AI assistant's work. You read a transcript and "
    "grade it against a rubric. Think about the rubric, then answer with one JSON object and "
    'nothing after it: {{"score": <integer 0-10>, "reason": "<one sentence>"}}.\n\nRubric:\n{rubric}'
)
_RANKING_SYSTEM = (
    "You are a careful, impartial evaluator. You are given several attempts by an AI assistant at "
    "the same task. Compare them with each other and give each a score between 0 and 1: better "
    "attempts get clearly higher scores than worse ones; equally good attempts get equal scores. "
    "Answer with one JSON object and nothing after it: "
    '{{"scores": [{{"id": <attempt number>, "score": <0-1>, "reason": "<one sentence>"}}, ...]}} '
    "with one entry for every attempt.\n\nWhat counts:\n{rubric}"
)


class MalformedJudgement(ValueError):
    """The judge's answer could not be read as the scores asked for."""


@dataclass(frozen=True)
class Scored:
    """One parsed score: the reward (0-1) and the judge's reason."""

    reward: float
    reason: str = ""


def rubric_messages(
    trajectory: Trajectory, *, rubric: str = DEFAULT_RUBRIC, reference: str | None = None
) -> list[dict[str, str]]:
    """The chat messages asking for an absolute rubric score of ``trajectory``."""
    user = f"Transcript:\n<transcript>\n{trajectory.render()}\n</transcript>"
    if reference:
        user += f"\n\nA reference answer (for your judgement only):\n<reference>\n{reference}\n</reference>"
    return [
        {"role": "system", "content": _RUBRIC_SYSTEM.format(rubric=rubric)},
        {"role": "user", "content": user + "\n\nGrade the transcript now."},
    ]


def ranking_messages(
    trajectories: Sequence[Trajectory], *, rubric: str = DEFAULT_RUBRIC, task: str | None = None
) -> list[dict[str, str]]:
    """The chat messages asking for relative scores of ``trajectories`` (same task)."""
    task = task if task is not None else (trajectories[0].task_text() if trajectories else "")
    parts = [f"The task:\n<task>\n{task}\n</task>"]
    for i, trajectory in enumerate(trajectories, start=1):
        parts.append(f'<attempt id="{i}">\n{trajectory.render()}\n</attempt>')
    parts.append(f"Score all {len(trajectories)} attempts now.")
    return [
        {"role": "system", "content": _RANKING_SYSTEM.format(rubric=rubric)},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


def _json_objects(text: str) -> list[Any]:
    """Every top-level JSON object that parses within ``text``, last first."""
    found = []
    depth = 0
    start = -1
    in_string = escaped = False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"' and depth > 0:
            in_string = True
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                try:
                    found.append(orjson.loads(text[start : i + 1]))
                except orjson.JSONDecodeError:
                    pass
    return found[::-1]


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool):
        raise MalformedJudgement(f"{what} is a boolean, not a number")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise MalformedJudgement(f"{what} {value!r} is not a number") from None
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise MalformedJudgement(f"{what} {value!r} is not a finite number")
    return float(value)


_SCORE_LINE = re.compile(r"\bscore\b\s*[:=]\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)


def parse_rubric(text: str) -> Scored:
    """The reward (``score / 10``) of a rubric answer; raises :class:`MalformedJudgement`."""
    if not isinstance(text, str) or not text.strip():
        raise MalformedJudgement("the judge answered nothing")
    for obj in _json_objects(text):
        if isinstance(obj, dict) and "score" in obj:
            score = _number(obj["score"], "score")
            reason = obj.get("reason")
            break
    else:
        match = _SCORE_LINE.search(text)
        if match is None:
            raise MalformedJudgement(f"no score in the answer: {text[:200]!r}")
        score, reason = float(match.group(1)), None
    if not 0 <= score <= 10:
        raise MalformedJudgement(f"score {score:g} is outside 0-10")
    return Scored(score / 10.0, reason if isinstance(reason, str) else "")


def parse_ranking(text: str, n: int) -> list[Scored]:
    """The relative rewards of ``n`` attempts, in attempt order; raises :class:`MalformedJudgement`."""
    if not isinstance(text, str) or not text.strip():
        raise MalformedJudgement("the judge answered nothing")
    entries = None
    for obj in _json_objects(text):
        if isinstance(obj, dict) and isinstance(obj.get("scores"), list):
            entries = obj["scores"]
            break
    if entries is None:
        raise MalformedJudgement(f'no {{"scores": [...]}} object in the answer: {text[:200]!r}')
    scored: dict[int, Scored] = {}
    for entry in entries:
        if not isinstance(entry, dict) or "id" not in entry or "score" not in entry:
            raise MalformedJudgement(f"an entry without id and score: {entry!r}"[:300])
        ident = _number(entry["id"], "id")
        if ident != int(ident) or not 1 <= ident <= n:
            raise MalformedJudgement(f"id {entry['id']!r} names no attempt (1-{n})")
        if int(ident) in scored:
            raise MalformedJudgement(f"attempt {int(ident)} is scored twice")
        score = _number(entry["score"], f"the score of attempt {int(ident)}")
        if not 0 <= score <= 1:
            raise MalformedJudgement(f"the score of attempt {int(ident)} ({score:g}) is outside 0-1")
        reason = entry.get("reason")
        scored[int(ident)] = Scored(score, reason if isinstance(reason, str) else "")
    missing = [i for i in range(1, n + 1) if i not in scored]
    if missing:
        raise MalformedJudgement(f"attempts {missing} have no score")
    return [scored[i] for i in range(1, n + 1)]
