"""Requests as the fake server's rules see them (:class:`FakeRequest`) and as it records them
(:class:`RecordedRequest`, :class:`RequestLog`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

__all__ = ["FakeRequest", "RecordedRequest", "RequestLog"]


@dataclass(slots=True)
class FakeRequest:
    """One completion request, as rule/failure matchers and reply callables see it."""

    kind: Literal["chat", "completion"]
    """``chat`` for ``/v1/chat/completions``, ``completion`` for ``/v1/completions``."""
    body: dict[str, Any]
    """The parsed JSON body (do not mutate it)."""
    headers: dict[str, str]
    """Request headers, names lower-cased."""
    model: str
    """The model the request asked for (the served name when it named none)."""
    text: str
    """What a regex ``match`` searches: the content of the last message (chat) or the prompt."""
    prompt_ids: list[int]
    """The prompt's token ids (:meth:`FakeTokenizer.render_chat` for chat)."""
    messages: list[dict[str, Any]] | None = None
    """Chat messages (``None`` for completions)."""
    tools: list[dict[str, Any]] | None = None
    """Chat tools, if any."""
    prompt: str | None = None
    """The completion prompt as text (``None`` for chat)."""
    choice: int = 0
    """Index of the choice being generated (``n`` > 1 asks the reply once per choice)."""


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """A request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    """Names lower-cased; repeated headers joined with ``", "``."""
    body: Any
    """The parsed JSON body; ``None`` when empty or not JSON."""
    time: float = field(default_factory=time.time)
    """Unix time of arrival."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the shape of ``GET /_fake/requests``)."""
        return {"method": self.method, "path": self.path, "headers": self.headers, "body": self.body, "time": self.time}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RecordedRequest:
        """Inverse of :meth:`to_dict`."""
        return cls(data["method"], data["path"], dict(data["headers"]), data.get("body"), data.get("time", 0.0))


class RequestLog(Sequence[RecordedRequest]):
    """Thread-safe, append-only list of :class:`RecordedRequest` with :meth:`clear`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[RecordedRequest] = []

    def append(self, request: RecordedRequest) -> None:
        """Record one request (called by the server)."""
        with self._lock:
            self._items.append(request)

    def clear(self) -> None:
        """Forget every recorded request."""
        with self._lock:
            self._items.clear()

    def snapshot(self) -> list[RecordedRequest]:
        """A copy of the current list."""
        with self._lock:
            return list(self._items)

    @overload
    def __getitem__(self, index: int) -> RecordedRequest: ...
    @overload
    def __getitem__(self, index: slice) -> list[RecordedRequest]: ...
    def __getitem__(self, index: int | slice) -> RecordedRequest | list[RecordedRequest]:
        with self._lock:
            return self._items[index]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[RecordedRequest]:
        return iter(self.snapshot())

    def __repr__(self) -> str:
        return f"RequestLog({len(self)} requests)"
