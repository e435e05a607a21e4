"""The RAG example's scoring: exact match and token F1 of the tagged answer (SQuAD/MuSiQue), and the reward.

The held-out metric is **exact match** (:func:`exact_match`: the normalised answer equals the
normalised gold answer or an alias), with F1 beside it. Training uses the denser


    reward = 0.1 * format + 0.9 * F1

- ``format`` is 1 when the reply holds a well-formed ``<answer>...</answer>`` with some text,
  else 0 (and then F1 is 0 too: an untagged reply scores nothing);
- ``F1`` is the token F1 between the last ``<answer>`` and the gold answer, the maximum over
  the answer and its aliases, after SQuAD's normalisation (lower case, no punctuation, no
  articles ``a``/``an``/``the``, single spaces) -- the official MuSiQue answer-F1.

So a right answer scores 1.0, a well-formed wrong one 0.1, no tag 0; and F1 can be read back
from a reward: ``F1 = (reward - 0.1) / 0.9`` when ``reward > 0``, else 0 (:func:`f1_from_reward`).
:func:`scores` gives all three for one reply (what the agent emits as reward dimensions).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

FORMAT_WEIGHT = 0.1
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower case, punctuation and articles removed, whitespace collapsed."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(prediction: str, gold: str) -> float:
    """Token-level F1 of two answers after :func:`normalize_answer`."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def extract_answer(text: str | None) -> str | None:
    """The text of the last non-empty ``<answer>...</answer>`` in ``text`` (None without one)."""
    answers = [a.strip() for a in ANSWER.findall(text or "") if a.strip()]
    return answers[-1] if answers else None


def best_f1(prediction: str, answers: Sequence[str]) -> float:
    """The maximum token F1 of ``prediction`` over the gold answer and its aliases."""
    return max((token_f1(prediction, gold) for gold in answers), default=0.0)


def exact_match(prediction: str, answers: Sequence[str]) -> float:
    """1.0 when the normalised prediction equals the normalised answer or an alias (SQuAD's EM), else 0.0."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(gold) for gold in answers))


def scores(text: str | None, answers: Sequence[str]) -> dict[str, float]:
    """``reward``, ``exact_match`` and ``f1`` of a final reply (0 for all without an ``<answer>``)."""
    answer = extract_answer(text)
    if answer is None:
        return {"reward": 0.0, "exact_match": 0.0, "f1": 0.0}
    return {
        "reward": reward(text, answers),
        "exact_match": exact_match(answer, answers),
        "f1": best_f1(answer, answers),
    }


def reward(text: str | None, answers: Sequence[str]) -> float:
    """``0.1 * format + 0.9 * F1`` of a final reply against the accepted answers (see the module doc)."""
    answer = extract_answer(text)
    if answer is None:
        return 0.0
    return FORMAT_WEIGHT + (1.0 - FORMAT_WEIGHT) * best_f1(answer, answers)


def f1_from_reward(value: float) -> float:
    """The answer F1 a reward of :func:`reward` holds."""
    return max(0.0, (value - FORMAT_WEIGHT) / (1.0 - FORMAT_WEIGHT)) if value > 0 else 0.0
