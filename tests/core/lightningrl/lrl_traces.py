"""Hand-built traces for LightningRL tests: one rollout's spans, each stored with a ``seq``.

Spans get increasing ``seq`` values in the order they are added (with gaps, as the store may
skip values), mimicking what the gateway, adapters, emitters and the runner write.
"""

from __future__ import annotations

import json
from typing import Any

from agentbolt import semconv
from agentbolt.request_fingerprint import fingerprints
from agentbolt.types import Rollout, RolloutStatus, Span, SpanEvent, SpanStatus, StatusCode

__all__ = ["Trace", "rollout"]


def rollout(rollout_id: str = "ro-1", *, group_id: str | None = "g1", **kw: Any) -> Rollout:
    """A finished rollout whose current attempt is ``at-<rollout_id>``."""
    kw.setdefault("current_attempt_id", f"at-{rollout_id}")
    kw.setdefault("status", RolloutStatus.SUCCEEDED)
    return Rollout(rollout_id=rollout_id, group_id=group_id, task_id="task", attempt_count=1, **kw)


class Trace:
    """Spans of one rollout attempt, added in ``seq`` order."""

    def __init__(
        self,
        rollout_id: str = "ro-1",
        *,
        group_id: str | None = "g1",
        attempt_id: str | None = None,
        seq_step: int = 3,
        **rollout_kw: Any,
    ) -> None:
        self.rollout = rollout(rollout_id, group_id=group_id, **rollout_kw)
        self.attempt_id = attempt_id or self.rollout.current_attempt_id
        self.spans: list[Span] = []
        self._seq = 0
        self._step = seq_step
        self._responses = 0

    def add(self, span: Span, *, attempt_id: str | bool | None = True) -> Span:
        """Store ``span`` with the next ``seq``."""
        self._seq += self._step
        aid = self.attempt_id if attempt_id is True else (attempt_id or None)
        span = span.model_copy(update={"seq": self._seq, "rollout_id": self.rollout.rollout_id, "attempt_id": aid})
        self.spans.append(span)
        return span

    # -- structure -------------------------------------------------------------------------------

    def agent(self, name: str, *, parent: Span | None = None, kind_attr: bool = False) -> Span:
        """An agent span (``invoke_agent``), or ``agentbolt.span.kind=agent`` with ``kind_attr``."""
        attrs: dict[str, Any] = {semconv.GEN_AI_AGENT_NAME: name}
        if kind_attr:
            attrs[semconv.SPAN_KIND_ATTR] = semconv.KIND_AGENT
        else:
            attrs[semconv.GEN_AI_OPERATION_NAME] = semconv.OP_INVOKE_AGENT
        return self.add(
            Span.create(f"invoke_agent {name}", attributes=attrs, parent_span_id=parent.span_id if parent else None)
        )

    def llm(
        self,
        prompt: list[int],
        response: list[int],
        *,
        logprobs: list[float] | None = None,
        source: str = "exact",
        response_id: str | None = None,
        parent: Span | None = None,
        agent_name: str | None = None,
        text: str | None = "ok",
        tool_calls: list[str] | None = None,
        finish: str = "stop",
        version: int | None = 1,
        error: str | None = None,
        policy: str | None = None,
        messages: list[dict[str, Any]] | None = None,
        start_ns: int | None = None,
    ) -> Span:
        """A gateway LLM-call span (``policy``: the policy by role that served it; ``messages``:
        the request's messages, recorded with their fingerprints as the gateway does)."""
        self._responses += 1
        rid = response_id or f"chatcmpl-{self.rollout.rollout_id}-{self._responses}"
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if tool_calls:
            message["tool_calls"] = [
                {"id": tid, "type": "function", "function": {"name": "f", "arguments": "{}"}} for tid in tool_calls
            ]
        attrs: dict[str, Any] = {
            semconv.SPAN_KIND_ATTR: semconv.KIND_LLM,
            semconv.GEN_AI_OPERATION_NAME: semconv.OP_CHAT,
            semconv.GEN_AI_RESPONSE_ID: rid,
            semconv.GEN_AI_RESPONSE_FINISH_REASONS: [finish],
            semconv.TOKEN_SOURCE: source,
            semconv.LLM_RESPONSE: json.dumps(
                {"id": rid, "choices": [{"index": 0, "message": message, "finish_reason": finish}]}
            ),
        }
        if source != "missing":
            attrs[semconv.PROMPT_TOKEN_IDS] = prompt
            attrs[semconv.RESPONSE_TOKEN_IDS] = response
            attrs[semconv.RESPONSE_LOGPROBS] = logprobs if logprobs is not None else [-0.5] * len(response)
        if version is not None:
            attrs[semconv.POLICY_VERSION] = version
        if agent_name is not None:
            attrs[semconv.GEN_AI_AGENT_NAME] = agent_name
        if policy is not None:
            attrs[semconv.POLICY_NAME] = policy
        if messages is not None:
            attrs[semconv.GEN_AI_INPUT_MESSAGES] = json.dumps(messages)
            attrs[semconv.LLM_REQUEST_FINGERPRINT] = fingerprints(messages)
        status = SpanStatus(code=StatusCode.ERROR, message=error) if error else None
        return self.add(
            Span.create(
                semconv.SPAN_LLM_CALL,
                attributes=attrs,
                parent_span_id=parent.span_id if parent else None,
                status=status,
                start_time_ns=start_ns,
                end_time_ns=None if start_ns is None else start_ns + 1_000_000,
            )
        )

    def framework_llm(
        self,
        response_id: str | None,
        *,
        parent: Span | None = None,
        output_messages: list[dict[str, Any]] | None = None,
        name: str = "chat gpt",
        input_messages: list[dict[str, Any]] | None = None,
        start_ns: int | None = None,
        end_ns: int | None = None,
    ) -> Span:
        """An adapter / OTel GenAI LLM span (no token ids)."""
        attrs: dict[str, Any] = {semconv.GEN_AI_OPERATION_NAME: semconv.OP_CHAT}
        if response_id is not None:
            attrs[semconv.GEN_AI_RESPONSE_ID] = response_id
        if output_messages is not None:
            attrs[semconv.GEN_AI_OUTPUT_MESSAGES] = json.dumps(output_messages)
        if input_messages is not None:
            attrs[semconv.GEN_AI_INPUT_MESSAGES] = json.dumps(input_messages)
        return self.add(
            Span.create(
                name,
                attributes=attrs,
                parent_span_id=parent.span_id if parent else None,
                start_time_ns=start_ns,
                end_time_ns=end_ns,
            )
        )

    def tool(
        self,
        name: str = "search",
        *,
        call_id: str | None = None,
        error: bool = False,
        parent: Span | None = None,
        exc: tuple[str, str] | None = None,
    ) -> Span:
        """A tool span (status ERROR with an exception event when ``error``)."""
        attrs: dict[str, Any] = {semconv.GEN_AI_OPERATION_NAME: semconv.OP_EXECUTE_TOOL, semconv.GEN_AI_TOOL_NAME: name}
        if call_id is not None:
            attrs[semconv.GEN_AI_TOOL_CALL_ID] = call_id
        events = []
        if error:
            etype, msg = exc or ("ToolError", "boom")
            events.append(
                SpanEvent(
                    name="exception",
                    time_ns=0,
                    attributes={semconv.EXCEPTION_TYPE: etype, semconv.EXCEPTION_MESSAGE: msg},
                )
            )
        return self.add(
            Span.create(
                f"execute_tool {name}",
                attributes=attrs,
                parent_span_id=parent.span_id if parent else None,
                status=SpanStatus(code=StatusCode.ERROR, message="failed") if error else None,
                events=events,
            )
        )

    def exception(self, etype: str = "ValueError", message: str = "bad", *, parent: Span | None = None) -> Span:
        """An ``agentbolt.exception`` span."""
        return self.add(
            Span.create(
                semconv.SPAN_EXCEPTION,
                attributes={
                    semconv.SPAN_KIND_ATTR: semconv.KIND_EXCEPTION,
                    semconv.EXCEPTION_TYPE: etype,
                    semconv.EXCEPTION_MESSAGE: message,
                },
                parent_span_id=parent.span_id if parent else None,
                status=SpanStatus(code=StatusCode.ERROR, message=message),
            )
        )

    def reward(
        self,
        value: float | None,
        *,
        final: bool = False,
        target_span: Span | str | None = None,
        target_response: str | None = None,
        dimensions: dict[str, float] | None = None,
        primary: str | None = None,
        attempt_id: str | bool | None = True,
    ) -> Span:
        """A reward span."""
        attrs: dict[str, Any] = {semconv.SPAN_KIND_ATTR: semconv.KIND_REWARD}
        if value is not None:
            attrs[semconv.REWARD_VALUE] = value
        if final:
            attrs[semconv.REWARD_IS_FINAL] = True
        if target_span is not None:
            attrs[semconv.REWARD_TARGET_SPAN_ID] = target_span if isinstance(target_span, str) else target_span.span_id
        if target_response is not None:
            attrs[semconv.REWARD_TARGET_RESPONSE_ID] = target_response
        if dimensions is not None:
            attrs[semconv.REWARD_DIMENSIONS] = json.dumps(dimensions)
        if primary is not None:
            attrs[semconv.REWARD_PRIMARY] = primary
        span = Span.create(semconv.SPAN_REWARD, attributes={k: v for k, v in attrs.items() if v == v})
        if any(v != v for v in attrs.values()):  # NaN: only a foreign writer could store it; bypass validation
            span = span.model_construct(**{**dict(span), "attributes": attrs})
        return self.add(span, attempt_id=attempt_id)

    def final(self, value: float) -> Span:
        """The runner's final reward (no attempt id, as written outside the attempt)."""
        return self.reward(value, final=True, attempt_id=None)
