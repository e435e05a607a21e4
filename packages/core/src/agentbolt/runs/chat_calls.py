"""A rollout's LLM calls as chat requests and replies: what SFT data and ATIF export read.

Token ids are not needed here: each call is the chat request the agent sent (OpenAI
``messages``, ``tools``, ``tool_choice``) and the assistant message it got back, read from the
call's spans -- the gateway's LLM-call span when the call went through agentbolt's gateway, else
the instrumentation's LLM span (an OpenInference / OpenLLMetry / AgentOps span translated by its
adapter, e.g. a trace ingested over OTLP: its GenAI ``parts`` or flattened ``gen_ai.prompt.{i}.*``
messages and its tool definitions read as retokenization reads them, by
:mod:`agentbolt.traces.messages`). So a traced rollout, whose ids were rebuilt by
retokenization or are missing, exports and trains like any other; the token data the call has is
carried along (:attr:`ChatCall.prompt_ids`, ...), with its :attr:`ChatCall.token_source`.

- :func:`rollout_chat_calls`: the calls of one rollout, in call order;
- :func:`select_rollouts`: the rollouts worth imitating (final reward at least a threshold,
  at most ``best_k`` per task) and of a source (``gateway`` / ``traces``);
- :func:`chat_record`: one call as a line of chat JSONL (TRL's conversational format with a
  ``tools`` column; ``agentbolt_torch.training.demonstrations.demonstrations_from_jsonl`` reads it
  back as demonstrations for ``torch-sft``).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .. import semconv
from .. import types as t
from ..lightningrl import spans as sp
from ..lightningrl.episode import LLMCall
from ..lightningrl.extraction import extract_episode
from ..traces.messages import flat_messages, openai_message, tool_definitions
from ..traces.metadata import META_SOURCE as TRACE_SOURCE_KEY
from ..traces.metadata import SOURCE_TRACE

__all__ = [
    "ChatCall",
    "RolloutSource",
    "chat_record",
    "normalize_message",
    "rollout_chat_calls",
    "rollout_source",
    "select_rollouts",
]


class RolloutSource(StrEnum):
    """Where a rollout's LLM calls were recorded."""

    gateway = "gateway"
    """By agentbolt's gateway, with the backend's own token ids (a training or ``.dev`` run, ``agentbolt serve``)."""
    traces = "traces"
    """Only by an instrumentation (OpenInference, OpenLLMetry, AgentOps spans, e.g. traces ingested
    over OTLP): token ids rebuilt by retokenization, or none; no behaviour logprobs."""


@dataclass(frozen=True)
class ChatCall:
    """One LLM call of a rollout as a chat request and its reply."""

    index: int
    """Order of the call in its rollout (0-based)."""
    messages: list[dict[str, Any]]
    """The request's OpenAI ``messages``."""
    reply: dict[str, Any]
    """The assistant message the call returned: ``role``, ``content`` and/or ``tool_calls``
    (and ``reasoning_content`` when the backend sent it)."""
    tools: list[dict[str, Any]] | None = None
    """The request's ``tools`` (when the span recorded the request body)."""
    tool_choice: Any = None
    """The request's ``tool_choice``."""
    agent_name: str | None = None
    model: str | None = None
    """The model that answered (``gen_ai.response.model``, else the requested one)."""
    prompt_ids: list[int] | None = None
    response_ids: list[int] | None = None
    response_logprobs: list[float] | None = None
    """Behaviour logprobs of the response tokens; ``None`` for traced calls (the serving model
    did not report them)."""
    token_source: t.TokenSource = t.TokenSource.MISSING
    input_tokens: int | None = None
    output_tokens: int | None = None
    start_time_ns: int | None = None
    span_id: str | None = None
    reward: float | None = None
    """The intermediate rewards attached to this call (``None``: none)."""
    metadata: dict[str, Any] = field(default_factory=dict)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ints(value: Any) -> list[int] | None:
    """Token ids when they are a list of integers (malformed ids are not carried)."""
    if isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        return list(value)
    return None


def _floats(value: Any, n: int | None) -> list[float] | None:
    """Logprobs when they are finite numbers, one per response token."""
    if not isinstance(value, list) or (n is not None and len(value) != n):
        return None
    if all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in value):
        return [float(x) for x in value]
    return None


def _message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded input message in OpenAI's shape (GenAI ``parts`` messages converted)."""
    if "parts" in message and "content" not in message:
        return {k: v for k, v in openai_message(message).items() if k != "finish_reason"}
    return dict(message)


def _reply(message: Mapping[str, Any]) -> dict[str, Any]:
    """An output message in OpenAI's shape (GenAI ``parts`` messages converted)."""
    if "parts" in message and "content" not in message:
        out = _message(message)
        out["content"] = out.get("content") or None
        out["role"] = "assistant"
        return out
    keep = ("role", "content", "tool_calls", "reasoning_content")
    out = {k: message[k] for k in keep if k in message}
    out["role"] = "assistant"
    return out


def _call_of(call: LLMCall, step_reward: float) -> ChatCall | None:
    spans = [s for s in (call.gateway_span, *call.framework_spans) if s is not None]
    messages: list[dict[str, Any]] = []
    outputs: Sequence[Mapping[str, Any]] = []
    for span in spans:  # the gateway's span first: it recorded the request and reply as sent
        # an instrumentation's span: GenAI messages, or AgentOps' / older OpenLLMetry's flattened ones
        if not messages:
            messages = [_message(m) for m in sp.input_messages(span) or flat_messages(span.attributes, "prompt")]
        if not outputs:
            outputs = sp.output_messages(span) or flat_messages(span.attributes, "completion")
    if not messages or not outputs:
        return None
    request: Mapping[str, Any] = {}
    for span in spans:
        body = sp.parse_json_attr(span, semconv.LLM_REQUEST)
        if isinstance(body, Mapping):
            request = body
            break
    if not request.get("tools"):  # a traced call: the tools its instrumentation recorded
        tools = next((found for s in spans if (found := tool_definitions(s))), None)
        if tools:
            request = {**request, "tools": tools}
    first = spans[0]
    model = None
    for key in (semconv.GEN_AI_RESPONSE_MODEL, semconv.GEN_AI_REQUEST_MODEL):
        value = next((s.attributes.get(key) for s in spans if isinstance(s.attributes.get(key), str)), None)
        if value:
            model = str(value)
            break
    return ChatCall(
        index=call.index,
        messages=messages,
        reply=_reply(outputs[0]),
        tools=list(request["tools"]) if isinstance(request.get("tools"), list) and request["tools"] else None,
        tool_choice=request.get("tool_choice"),
        agent_name=call.agent_name,
        model=model,
        prompt_ids=_ints(call.prompt_ids),
        response_ids=_ints(call.response_ids),
        response_logprobs=_floats(call.response_logprobs, len(call.response_ids or [])),
        token_source=call.token_source,
        input_tokens=_int(sp.genai_attribute(first, semconv.GEN_AI_USAGE_INPUT_TOKENS)),
        output_tokens=_int(sp.genai_attribute(first, semconv.GEN_AI_USAGE_OUTPUT_TOKENS)),
        start_time_ns=first.start_time_ns,
        span_id=call.span_id,
        reward=step_reward if step_reward else None,
    )


def rollout_chat_calls(rollout: t.Rollout, spans: Sequence[t.Span]) -> list[ChatCall]:
    """The chat calls of ``rollout``'s final attempt, in call order (LightningRL's calls: gateway
    calls when the rollout has any, else its instrumentation LLM spans). Failed calls, text
    completions and calls whose spans recorded no messages are left out."""
    episode = extract_episode(rollout, spans, allow_retokenized=True)
    out = []
    for call, step_reward in zip(episode.calls, episode.step_rewards, strict=True):
        span = call.gateway_span if call.gateway_span is not None else call.framework_spans[0]
        if span.status.code == t.StatusCode.ERROR:
            continue
        if span.attributes.get(semconv.GEN_AI_OPERATION_NAME) == semconv.OP_TEXT_COMPLETION:
            continue
        chat = _call_of(call, step_reward)
        if chat is not None:
            out.append(chat)
    return out


def rollout_source(rollout: t.Rollout, calls: Sequence[ChatCall]) -> RolloutSource:
    """``traces`` for a rollout ingested from traces (its metadata says so) or whose calls carry
    no exact token ids; else ``gateway``."""
    if rollout.metadata.get(TRACE_SOURCE_KEY) == SOURCE_TRACE:
        return RolloutSource.traces
    return (
        RolloutSource.gateway
        if any(c.token_source == t.TokenSource.EXACT and c.response_ids for c in calls)
        else RolloutSource.traces
    )


def select_rollouts(
    rollouts: Sequence[t.Rollout], *, min_reward: float | None = None, best_k: int | None = None
) -> list[t.Rollout]:
    """The rollouts whose final reward is at least ``min_reward`` (all with ``None``; a rollout
    without a reward never passes a threshold), and with ``best_k`` only the ``best_k`` highest
    rewards of each task (ties: the earlier in ``rollouts``), in their order in ``rollouts``."""
    if best_k is not None and best_k < 1:
        from ..errors import UserError

        raise UserError(f"best_k must be at least 1, got {best_k} (leave it out to keep every rollout)")
    kept = [r for r in rollouts if min_reward is None or (r.final_reward is not None and r.final_reward >= min_reward)]
    if best_k is None:
        return kept
    by_task: dict[str | None, list[tuple[int, t.Rollout]]] = defaultdict(list)
    for i, r in enumerate(kept):
        by_task[r.task_id].append((i, r))
    chosen: set[int] = set()
    for members in by_task.values():
        ranked = sorted(
            members, key=lambda p: (-(p[1].final_reward if p[1].final_reward is not None else -1e300), p[0])
        )
        chosen.update(i for i, _ in ranked[:best_k])
    return [r for i, r in enumerate(kept) if i in chosen]


def normalize_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message reduced to what a chat template renders: ``role``, text ``content`` (content
    parts joined), ``tool_calls`` (id, name, arguments as a JSON object where they parse) and
    ``tool_call_id``; absent and empty fields dropped. Two messages that normalize equal are the
    same turn (used to find where a call's prompt continues the previous call)."""
    out: dict[str, Any] = {"role": str(message.get("role") or "")}
    content = message.get("content")
    text = sp._content_text(content) if content is not None else None
    if text:
        out["content"] = text
    calls = []
    for call in message.get("tool_calls") or []:
        if not isinstance(call, Mapping):
            continue
        fn = call.get("function") or {}
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                pass
        calls.append({"id": str(call.get("id") or ""), "name": str(fn.get("name") or ""), "arguments": args or {}})
    if calls:
        out["tool_calls"] = calls
    if message.get("tool_call_id"):
        out["tool_call_id"] = str(message["tool_call_id"])
    return out


def chat_record(rollout: t.Rollout, call: ChatCall) -> dict[str, Any]:
    """One call as a chat JSONL record: ``messages`` (the request's messages, then the reply) and
    ``tools`` -- TRL's conversational format -- plus where it came from (``rollout_id``,
    ``task_id``, ``index``, ``agent_name``, ``reward``: the rollout's final reward,
    ``step_reward``, ``token_source``) and the request's ``tool_choice``."""
    return {
        "messages": [*call.messages, call.reply],
        "tools": call.tools,
        "tool_choice": call.tool_choice,
        "rollout_id": rollout.rollout_id,
        "task_id": rollout.task_id,
        "index": call.index,
        "agent_name": call.agent_name,
        "reward": rollout.final_reward,
        "step_reward": call.reward,
        "token_source": call.token_source.value,
    }
