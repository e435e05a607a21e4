"""What configures a :class:`~agentbolt.testing.fake_llm.FakeLLM`: reply rules, tool-call
replies and injected failures (frozen pydantic models, validated once; the JSON form of
``--config`` files)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, TypeAlias

import orjson
from pydantic import BaseModel, ConfigDict, Field

from .request_log import FakeRequest

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_REPLY",
    "Failure",
    "FakeLLMConfig",
    "Match",
    "Reply",
    "Rule",
    "ToolCall",
    "ToolCalls",
]

DEFAULT_MODEL = "fake-model"
DEFAULT_REPLY = "This is a reply from the fake LLM."

_CONFIG = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True, use_attribute_docstrings=True)


class ToolCall(BaseModel):
    """One tool call in a reply: ``ToolCall("get_weather", {"city": "Paris"})``."""

    model_config = _CONFIG

    name: str
    """The function name."""
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    """Arguments: a dict (sent as compact JSON) or a JSON string sent verbatim."""
    id: str | None = None
    """The call id; a unique ``call_...`` id when ``None``."""

    def __init__(self, name: str | None = None, arguments: dict[str, Any] | str | None = None, /, **data: Any) -> None:
        if name is not None:
            data["name"] = name
        if arguments is not None:
            data["arguments"] = arguments
        super().__init__(**data)

    def arguments_json(self) -> str:
        """The arguments as the JSON string that goes on the wire."""
        return self.arguments if isinstance(self.arguments, str) else orjson.dumps(self.arguments).decode()


class ToolCalls(BaseModel):
    """A reply made of tool calls (and optional text before them): ``ToolCalls([ToolCall(...)])``.

    On ``/v1/chat/completions`` it becomes ``message.tool_calls`` with ``finish_reason:
    "tool_calls"``; on ``/v1/completions`` its rendering (see
    :meth:`FakeTokenizer.render_tool_calls`) is the text.
    """

    model_config = _CONFIG

    tool_calls: tuple[ToolCall, ...] = Field(min_length=1)
    """The calls, in order (at least one)."""
    content: str | None = None
    """Text before the calls (``message.content``; ``null`` when ``None``)."""

    def __init__(self, tool_calls: Iterable[ToolCall | Mapping[str, Any]] | None = None, /, **data: Any) -> None:
        if tool_calls is not None:
            data["tool_calls"] = tuple(tool_calls)
        super().__init__(**data)


ReplyValue: TypeAlias = str | ToolCall | ToolCalls
Reply: TypeAlias = ReplyValue | Callable[[FakeRequest], Any]
"""A reply: text, tool calls, or ``callable(request) -> str | ToolCall | ToolCalls | list[ToolCall]``."""
Match: TypeAlias = re.Pattern[str] | Callable[[FakeRequest], bool] | None
"""``None`` (always), a regex searched in :attr:`FakeRequest.text`, or ``callable(request) -> bool``."""


class Rule(BaseModel):
    """Answer requests that ``match`` with ``reply``. Rules are tried in order; the first that
    matches answers; requests no rule matches get ``FakeLLM.default_reply``.

    ``reply`` given as a list is a script: successive matching replies take successive items
    (one per choice), and once it is used up the rule no longer matches.
    """

    model_config = _CONFIG

    match: Match = None
    """Which requests: a regex (string or compiled) searched in :attr:`FakeRequest.text`, a
    callable, or ``None`` for all."""
    reply: Reply | list[Reply]
    """The reply, or a script of replies."""


class Failure(BaseModel):
    """A failure injected instead of (``status``, ``drop``), before (``timeout``) or in the
    middle of (``drop_mid_stream``) an answer.

    Failures are tried in order before generating a reply; the first one that triggers applies.
    A failure triggers on a completion request when ``match`` matches, it has ``times`` left, and
    its seeded coin (``probability``) comes up.
    """

    model_config = _CONFIG

    kind: Literal["status", "timeout", "drop", "drop_mid_stream"] = "status"
    """``status``: answer ``status`` with an OpenAI-style error body. ``timeout``: wait
    ``hang_s`` seconds (or until the client leaves), then answer normally. ``drop``: close the
    connection without a response. ``drop_mid_stream``: send ``after_chunks`` SSE events (for a
    non-streaming request, half the body), then close the connection."""
    status: int = Field(default=500, ge=400, le=599)
    """HTTP status of a ``status`` failure."""
    message: str = "injected failure from the fake LLM"
    """``error.message`` of a ``status`` failure."""
    error_type: str | None = None
    """``error.type``; by default derived from ``status`` (``server_error`` for 5xx)."""
    times: int | None = Field(default=None, ge=0)
    """Trigger at most this many times (``None``: no limit)."""
    probability: float | None = Field(default=None, ge=0.0, le=1.0)
    """Trigger on this fraction of matching requests, drawn from ``random.Random(seed)``."""
    seed: int = 0
    """Seed of the ``probability`` draws."""
    match: Match = None
    """Which requests (as :attr:`Rule.match`)."""
    hang_s: float = Field(default=30.0, ge=0.0)
    """How long a ``timeout`` failure waits before answering."""
    after_chunks: int = Field(default=2, ge=0)
    """How many SSE events ``drop_mid_stream`` sends before closing."""


class FakeLLMConfig(BaseModel):
    """Everything that configures a :class:`FakeLLM`; JSON form of ``--config`` files."""

    model_config = _CONFIG

    rules: tuple[Rule, ...] = ()
    """Reply rules, tried in order."""
    default_reply: Reply = DEFAULT_REPLY
    """The reply when no rule matches."""
    model: str = DEFAULT_MODEL
    """The served model name (listed by ``/v1/models``)."""
    strict_model: bool = False
    """Answer 404 ``model_not_found`` to requests for another model (else answer anyway)."""
    latency_s: float | Callable[[FakeRequest], float] = 0.0
    """Delay before answering a completion request: seconds, or ``callable(request)``."""
    token_latency_s: float = Field(default=0.0, ge=0.0)
    """Delay between streamed tokens."""
    failures: tuple[Failure, ...] = ()
    """Injected failures, tried in order."""
    eos_token: bool = False
    """End naturally finished responses with ``<|im_end|>`` in ``token_ids`` (as vLLM reports
    the end-of-sequence token); the text never shows it."""
    record: bool = True
    """Record requests in :attr:`FakeLLM.requests` (turn off for long benchmarks)."""
    token_ids: bool = True
    """Honour ``return_token_ids``; ``False`` answers text only, as a hosted API, SGLang or
    llama.cpp do (for retokenization tests)."""
