"""A scripted optimizer LLM for APO tests: a fake OpenAI-compatible server answering APO's
critique and edit requests from scripts or functions.

    optimizer = ScriptedOptimizer(
        critique="The answers must be in upper case.",
        edit=lambda req: f"<prompt>{req.prompt}\\nAnswer in UPPERCASE.</prompt>",
    )
    with FakeLLMServer(optimizer.fake_llm()) as server:
        Trainer(agent, algorithm="apo", algorithm_config={
            "initial_prompt": "Repeat the word.", "optimizer_base_url": server.base_url,
            "optimizer_model": "fake-model", "optimizer_api_key_env": None}).fit(train, val)
    optimizer.critiques, optimizer.edits   # what APO asked, parsed

A reply is a string, a function of the parsed request, or a list of those: a script, taken in
order (the last item repeats once it is used up). Requests are answered concurrently by APO,
so which request gets which script item is not fixed: script items that must go to a given
prompt are better written as functions.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from agentbolt.testing.fake_llm import FakeLLM, FakeRequest

from .optimizer import extract_tag, request_kind

__all__ = ["CritiqueRequest", "EditRequest", "ScriptedOptimizer"]


@dataclass(frozen=True)
class CritiqueRequest:
    """A critique request as APO sent it."""

    prompt: str
    """The prompt to critique."""
    failures: str
    """The ``<failures>`` block: each failed task's input, output and reward."""


@dataclass(frozen=True)
class EditRequest:
    """An edit request as APO sent it."""

    prompt: str
    """The prompt to edit."""
    critique: str
    """The critique the edit answers."""


CritiqueReply: TypeAlias = str | Callable[[CritiqueRequest], str]
EditReply: TypeAlias = str | Callable[[EditRequest], str]


class _Script:
    def __init__(self, reply: object) -> None:
        self.items = list(reply) if isinstance(reply, Sequence) and not isinstance(reply, str) else [reply]
        if not self.items:
            raise ValueError("a script needs at least one reply")
        self.position = 0
        self.lock = threading.Lock()

    def next(self) -> object:
        with self.lock:
            item = self.items[min(self.position, len(self.items) - 1)]
            self.position += 1
            return item

    def answer(self, request: object) -> str:
        """The next reply for ``request``: a callable one is called with it."""
        item = self.next()
        return item(request) if callable(item) else str(item)


class ScriptedOptimizer:
    """Answers APO's optimizer requests (see the module docstring).

    Args:
        critique: the critique reply (text, ``fn(CritiqueRequest) -> str``, or a list of those).
        edit: the edit reply (text, ``fn(EditRequest) -> str``, or a list of those); a usable one
            holds the new prompt between ``<prompt>`` and ``</prompt>``.
    """

    def __init__(
        self,
        *,
        critique: CritiqueReply | Sequence[CritiqueReply] = "The prompt should be more specific.",
        edit: EditReply | Sequence[EditReply],
    ) -> None:
        self._critique = _Script(critique)
        self._edit = _Script(edit)
        self._lock = threading.Lock()
        self.critiques: list[CritiqueRequest] = []
        """Every critique request received, in order."""
        self.edits: list[EditRequest] = []
        """Every edit request received, in order."""
        self.other: list[FakeRequest] = []
        """Requests that were neither (answered with an empty-looking text)."""

    def reply(self, request: FakeRequest) -> str:
        """The answer to one chat request (the fake server calls this)."""
        messages = request.messages or []
        user = next((str(m.get("content", "")) for m in reversed(messages) if m.get("role") == "user"), "")
        kind = request_kind(messages)
        prompt = extract_tag(user, "prompt") or ""
        if kind == "critique":
            req = CritiqueRequest(prompt=prompt, failures=extract_tag(user, "failures") or "")
            with self._lock:
                self.critiques.append(req)
            return self._critique.answer(req)
        if kind == "edit":
            edit = EditRequest(prompt=prompt, critique=extract_tag(user, "critique") or "")
            with self._lock:
                self.edits.append(edit)
            return self._edit.answer(edit)
        with self._lock:
            self.other.append(request)
        return "This is not an APO optimizer request."

    def fake_llm(self, **options: Any) -> FakeLLM:
        """A :class:`~agentbolt.testing.fake_llm.FakeLLM` answering with :meth:`reply`
        (``options`` are its other arguments: ``failures``, ``latency_s``, ...)."""
        return FakeLLM(default_reply=self.reply, **options)
