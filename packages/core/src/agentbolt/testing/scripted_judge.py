"""A scripted judge for tests: a fake OpenAI-compatible server answering the judge prompts of
:mod:`agentbolt.rewards.prompts` from functions of the parsed request.

    judge = ScriptedJudge(rubric=lambda req: 10 if "Paris" in req.transcript else 2)
    with FakeLLMServer(judge.fake_llm()) as server:
        scorer = LLMJudge(server.base_url, "fake-model")
        ...
    judge.rubric_requests, judge.ranking_requests   # what was asked, parsed

``rubric`` returns a 0-10 score (or a raw answer string, to test malformed answers); ``ranking``
returns one 0-1 score per attempt (or a raw string). ``raw`` answers every request with
scripted texts in order (the last repeats), whatever it is.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from .fake_llm import FakeLLM, FakeRequest

__all__ = ["RankingRequest", "RubricRequest", "ScriptedJudge"]

_TRANSCRIPT = re.compile(r"<transcript>\n(.*?)\n</transcript>", re.DOTALL)
_REFERENCE = re.compile(r"<reference>\n(.*?)\n</reference>", re.DOTALL)
_TASK = re.compile(r"<task>\n(.*?)\n</task>", re.DOTALL)
_ATTEMPT = re.compile(r'<attempt id="(\d+)">\n(.*?)\n</attempt>', re.DOTALL)


@dataclass(frozen=True)
class RubricRequest:
    """A rubric request as the judge sent it."""

    transcript: str
    reference: str | None
    system: str


@dataclass(frozen=True)
class RankingRequest:
    """A ranking request: the task and each attempt's transcript, in order."""

    task: str
    attempts: list[str]
    system: str


class ScriptedJudge:
    """Answers judge requests (see the module docstring)."""

    def __init__(
        self,
        *,
        rubric: Callable[[RubricRequest], float | str] | None = None,
        ranking: Callable[[RankingRequest], Sequence[float] | str] | None = None,
        raw: Sequence[str] | None = None,
    ) -> None:
        self._rubric = rubric or (lambda req: 5)
        self._ranking = ranking or (lambda req: [0.5] * len(req.attempts))
        self._raw = list(raw) if raw else None
        self._position = 0
        self._lock = threading.Lock()
        self.rubric_requests: list[RubricRequest] = []
        self.ranking_requests: list[RankingRequest] = []

    def reply(self, request: FakeRequest) -> str:
        """The answer to one chat request (the fake server calls this)."""
        messages = request.messages or []
        system = next((str(m.get("content", "")) for m in messages if m.get("role") == "system"), "")
        user = next((str(m.get("content", "")) for m in reversed(messages) if m.get("role") == "user"), "")
        if self._raw is not None:
            with self._lock:
                text = self._raw[min(self._position, len(self._raw) - 1)]
                self._position += 1
            return text
        attempts = _ATTEMPT.findall(user)
        if attempts:
            task = _TASK.search(user)
            ranking = RankingRequest(task.group(1) if task else "", [a[1] for a in attempts], system)
            with self._lock:
                self.ranking_requests.append(ranking)
            scores = self._ranking(ranking)
            if isinstance(scores, str):
                return scores
            entries = [{"id": i, "score": float(s), "reason": "scripted"} for i, s in enumerate(scores, start=1)]
            return "Comparing the attempts.\n" + orjson.dumps({"scores": entries}).decode()
        transcript = _TRANSCRIPT.search(user)
        reference = _REFERENCE.search(user)
        req = RubricRequest(
            transcript.group(1) if transcript else user, reference.group(1) if reference else None, system
        )
        with self._lock:
            self.rubric_requests.append(req)
        score: Any = self._rubric(req)
        if isinstance(score, str):
            return score
        return orjson.dumps({"score": score, "reason": "scripted"}).decode()

    def fake_llm(self, **options: Any) -> FakeLLM:
        """A :class:`~agentbolt.testing.fake_llm.FakeLLM` answering with :meth:`reply`."""
        return FakeLLM(default_reply=self.reply, **options)
