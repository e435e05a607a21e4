"""Rollouts as ATIF trajectories (the Agent Trajectory Interchange Format, v1.8), and back.

ATIF is the JSON format other agent tools read and write (Harbor, atif-scan...); the ``atif``
package's pydantic models build and validate every document written here.

**Rollout → trajectory** (:func:`rollout_trajectory`). The rollout's chat calls
(:func:`~agentbolt.runs.chat_calls.rollout_chat_calls`: gateway calls, or the instrumentation's
LLM spans of a traced rollout) are walked in order. Each call's prompt usually continues the
conversation so far (the previous prompt, the reply, the tool results); only the new messages
become steps:

- a ``system`` / ``developer`` message → a ``system`` step; a ``user`` message → a ``user`` step;
- an ``assistant`` message that is in a prompt but was not produced by a recorded call
  (few-shot examples, a history the agent replays) → an ``agent`` step with
  ``is_copied_context = true`` and ``llm_call_count = 0`` (ATIF: consumers keep such steps out
  of SFT data);
- a ``tool`` message → an ``ObservationResult`` of the agent step whose tool call it answers
  (``source_call_id``), or of a ``system`` step when no step made that call;
- the call's reply → an ``agent`` step (``llm_call_count = 1``): ``message`` (its text),
  ``reasoning_content``, ``tool_calls`` (arguments parsed into a JSON object; arguments that are
  not a JSON object keep their text in ``extra.arguments_text``), ``model_name``, and
  ``metrics``: token counts, ``prompt_token_ids``, ``completion_token_ids`` and ``logprobs``
  when the call has them (exact or retokenized: ``extra.agentbolt.token_source`` says which).

A call whose prompt does not continue the conversation (another agent, a fresh context) starts
over: its first step carries ``extra.agentbolt.context = "new"`` and all its messages become
steps again.

Rewards have no field of their own in ATIF: the rollout's final reward is ``extra.reward`` of
the trajectory (with ``rollout_id``, ``task_id``, ``run_id``, ``mode``, ``status``, the task
``input``) and an intermediate reward attached to a call is ``extra.reward`` of its agent step.
The request's tools are ``agent.tool_definitions`` (a call with other tools has them in
``extra.agentbolt.tools``).

**Trajectory → chat calls** (:func:`trajectory_calls`): the inverse, for any ATIF v1.x document
(ours or another tool's): for each agent step made by a model, the chat request it answered
(the steps before it, copied context and observations included) and its reply.
``agentbolt_torch.training.demonstrations.demonstrations_from_atif`` trains ``torch-sft`` on them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import types as t
from ..errors import UserError
from ..lightningrl import spans as sp
from .chat_calls import ChatCall, normalize_message, rollout_chat_calls

if TYPE_CHECKING:
    import atif

__all__ = [
    "ATIF_SCHEMA_VERSION",
    "AtifCall",
    "read_atif",
    "rollout_trajectory",
    "trajectory_calls",
    "trajectory_reward",
]

ATIF_SCHEMA_VERSION = "ATIF-v1.8"
"""The ``schema_version`` written."""

_NS = "agentbolt"
"""Key of agentbolt's own data in ``extra`` objects."""


def _atif() -> Any:
    try:
        import atif
    except ModuleNotFoundError as exc:  # a core dependency; a trimmed install may lack it
        raise UserError("ATIF export needs the atif package: pip install 'atif>=1.8,<1.9'") from exc
    return atif


def _text(content: Any) -> str:
    text = sp._content_text(content)  # a string, or the text of content parts
    if text is not None:
        return text
    return "" if content is None else json.dumps(content)


def _timestamp(ns: int | None) -> str | None:
    if not ns:
        return None
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat().replace("+00:00", "Z")


def _tool_calls(message: Mapping[str, Any]) -> list[Any] | None:
    atif = _atif()
    out = []
    for i, call in enumerate(message.get("tool_calls") or []):
        if not isinstance(call, Mapping):
            continue
        fn = call.get("function") or {}
        raw = fn.get("arguments")
        extra = None
        args: Any = raw
        if isinstance(raw, str):
            try:
                args = json.loads(raw) if raw.strip() else {}
            except ValueError:
                args = None
        if not isinstance(args, dict):
            args, extra = {}, {"arguments_text": raw if isinstance(raw, str) else json.dumps(raw)}
        out.append(
            atif.ToolCall(
                tool_call_id=str(call.get("id") or f"call_{i}"),
                function_name=str(fn.get("name") or ""),
                arguments=args,
                extra=extra,
            )
        )
    return out or None


class _Builder:
    """Steps of one trajectory, built call by call."""

    def __init__(self) -> None:
        self.steps: list[Any] = []
        self.history: list[dict[str, Any]] = []
        """The conversation so far, normalized (prompt messages and replies)."""
        self.calls_made: dict[str, int] = {}
        """tool_call_id -> index in ``steps`` of the agent step that made it."""
        self.new_context = False

    def _extra(self, extra: dict[str, Any] | None) -> dict[str, Any] | None:
        if self.new_context:
            self.new_context = False
            extra = dict(extra or {})
            extra[_NS] = {**extra.get(_NS, {}), "context": "new"}
        return extra

    def _append(self, **fields: Any) -> None:
        atif = _atif()
        fields["extra"] = self._extra(fields.get("extra"))
        step = atif.Step(step_id=len(self.steps) + 1, **fields)
        for call in step.tool_calls or ():
            self.calls_made[call.tool_call_id] = len(self.steps)
        self.steps.append(step)

    def _observe(self, message: Mapping[str, Any]) -> None:
        atif = _atif()
        call_id = str(message.get("tool_call_id") or "") or None
        result = atif.ObservationResult(source_call_id=call_id, content=_text(message.get("content")))
        at = self.calls_made.get(call_id) if call_id else None
        if at is None:
            extra = {"tool_call_id": call_id} if call_id else None
            orphan = result.model_copy(update={"source_call_id": None, "extra": extra})
            self._append(source="system", message="", observation=atif.Observation(results=[orphan]))
            return
        step = self.steps[at]
        results = [*(step.observation.results if step.observation else []), result]
        self.steps[at] = step.model_copy(update={"observation": atif.Observation(results=results)})

    def _message(self, message: Mapping[str, Any]) -> None:
        role = str(message.get("role") or "")
        if role == "tool":
            self._observe(message)
        elif role in ("system", "developer"):
            extra = {_NS: {"role": role}} if role == "developer" else None
            self._append(source="system", message=_text(message.get("content")), extra=extra)
        elif role == "assistant":
            reasoning = message.get("reasoning_content")
            self._append(
                source="agent",
                message=_text(message.get("content")),
                tool_calls=_tool_calls(message),
                reasoning_content=reasoning if isinstance(reasoning, str) and reasoning else None,
                llm_call_count=0,
                is_copied_context=True,
            )
        else:
            self._append(source="user", message=_text(message.get("content")))

    def call(self, call: ChatCall, tool_definitions: list[dict[str, Any]] | None) -> None:
        atif = _atif()
        prompt = [normalize_message(m) for m in call.messages]
        if prompt[: len(self.history)] == self.history:
            new = call.messages[len(self.history) :]
        else:  # another agent or a fresh context: its whole prompt
            new = call.messages
            self.new_context = bool(self.steps)
            self.calls_made = {}
        for message in new:
            self._message(message)
        agentbolt: dict[str, Any] = {"call_index": call.index, "token_source": call.token_source.value}
        if call.span_id:
            agentbolt["span_id"] = call.span_id
        if call.agent_name:
            agentbolt["agent_name"] = call.agent_name
        if call.tools != tool_definitions:
            agentbolt["tools"] = call.tools
        if call.tool_choice is not None:
            agentbolt["tool_choice"] = call.tool_choice
        extra: dict[str, Any] = {_NS: agentbolt}
        if call.reward is not None:
            extra["reward"] = call.reward
        metrics = atif.Metrics(
            prompt_tokens=call.input_tokens if call.input_tokens is not None else _len(call.prompt_ids),
            completion_tokens=call.output_tokens if call.output_tokens is not None else _len(call.response_ids),
            prompt_token_ids=call.prompt_ids,
            completion_token_ids=call.response_ids,
            logprobs=call.response_logprobs,
        )
        reasoning = call.reply.get("reasoning_content")
        self._append(
            source="agent",
            timestamp=_timestamp(call.start_time_ns),
            model_name=call.model,
            message=_text(call.reply.get("content")),
            reasoning_content=reasoning if isinstance(reasoning, str) and reasoning else None,
            tool_calls=_tool_calls(call.reply),
            metrics=metrics,
            llm_call_count=1,
            extra=extra,
        )
        self.history = [*prompt, normalize_message(call.reply)]


def _len(ids: Sequence[int] | None) -> int | None:
    return None if ids is None else len(ids)


def rollout_trajectory(
    rollout: t.Rollout,
    spans: Sequence[t.Span],
    *,
    agent_name: str = "agentbolt",
    agent_version: str | None = None,
    run_id: str | None = None,
    calls: Sequence[ChatCall] | None = None,
) -> atif.Trajectory:
    """The ATIF trajectory of ``rollout`` (rules in the module docstring), validated by ``atif``.

    Args:
        rollout: the rollout.
        spans: its spans (``store.query_spans([id], latest_attempt_only=True)[id]``).
        agent_name, agent_version: ``agent.name`` / ``agent.version`` (default: agentbolt's
            version); the agent's name from its spans, when it has one, is in ``agent.extra``.
        run_id: the run it belongs to (``extra.run_id``).
        calls: its chat calls when already read (default: :func:`rollout_chat_calls`).

    Raises:
        UserError: the rollout has no chat call with recorded messages (nothing to write).
    """
    atif = _atif()
    chat = list(calls) if calls is not None else rollout_chat_calls(rollout, spans)
    if not chat:
        raise UserError(f"rollout {rollout.rollout_id} has no LLM call with recorded messages: no trajectory to write")
    tools = next((c.tools for c in chat if c.tools), None)
    builder = _Builder()
    for call in chat:
        builder.call(call, tools)
    models = [c.model for c in chat if c.model]
    names = sorted({c.agent_name for c in chat if c.agent_name})
    if agent_version is None:
        from .. import __version__

        agent_version = __version__
    extra = {
        "reward": rollout.final_reward,
        "rollout_id": rollout.rollout_id,
        "task_id": rollout.task_id,
        "run_id": run_id,
        "mode": rollout.mode.value,
        "status": rollout.status.value,
        "input": rollout.input,
    }
    prompt = [c.input_tokens for c in chat]
    completion = [c.output_tokens for c in chat]
    return atif.Trajectory(
        schema_version=ATIF_SCHEMA_VERSION,
        session_id=rollout.rollout_id,
        trajectory_id=rollout.rollout_id,
        agent=atif.Agent(
            name=agent_name,
            version=agent_version,
            model_name=models[0] if models else None,
            tool_definitions=tools,
            extra={"agent_names": names} if names else None,
        ),
        steps=builder.steps,
        final_metrics=atif.FinalMetrics(
            total_prompt_tokens=sum(p for p in prompt if p is not None) if any(p is not None for p in prompt) else None,
            total_completion_tokens=sum(c for c in completion if c is not None)
            if any(c is not None for c in completion)
            else None,
            total_steps=len(builder.steps),
        ),
        extra={k: v for k, v in extra.items() if v is not None},
    )


# --- reading back ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class AtifCall:
    """An agent step of a trajectory read back as the chat request it answered."""

    step_id: int
    messages: list[dict[str, Any]]
    """The request's OpenAI messages (every step before it, in its context)."""
    reply: dict[str, Any]
    """The assistant message of the step (``content``, ``tool_calls``, ``reasoning_content``)."""
    tools: list[dict[str, Any]] | None
    tool_choice: Any
    reward: float | None
    """The step's ``extra.reward``."""
    prompt_ids: list[int] | None
    completion_ids: list[int] | None
    logprobs: list[float] | None
    model_name: str | None
    agent_name: str | None


def _assistant(step: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": _text(step.message) or None}
    calls = []
    for call in step.tool_calls or ():
        text = (call.extra or {}).get("arguments_text")
        calls.append(
            {
                "id": call.tool_call_id,
                "type": "function",
                "function": {
                    "name": call.function_name,
                    "arguments": text if isinstance(text, str) else json.dumps(call.arguments),
                },
            }
        )
    if calls:
        message["tool_calls"] = calls
    if step.reasoning_content:
        message["reasoning_content"] = step.reasoning_content
    return message


def _observations(step: Any) -> Iterator[dict[str, Any]]:
    for result in step.observation.results if step.observation else ():
        call_id = result.source_call_id or (result.extra or {}).get("tool_call_id")
        message: dict[str, Any] = {"role": "tool", "content": _text(result.content)}
        if call_id:
            message["tool_call_id"] = call_id
        yield message


def trajectory_calls(trajectory: atif.Trajectory) -> list[AtifCall]:
    """The model calls of ``trajectory`` as chat requests and replies (module docstring): one per
    agent step that is not copied context and not a deterministic dispatch
    (``llm_call_count = 0``), in step order."""
    history: list[dict[str, Any]] = []
    out: list[AtifCall] = []
    default_tools = trajectory.agent.tool_definitions
    for step in trajectory.steps:
        ours = (step.extra or {}).get(_NS) or {}
        if ours.get("context") == "new":
            history = []
        if step.source == "system":
            if step.observation is None or _text(step.message):
                role = "developer" if ours.get("role") == "developer" else "system"
                history.append({"role": role, "content": _text(step.message)})
        elif step.source == "user":
            history.append({"role": "user", "content": _text(step.message)})
        else:
            reply = _assistant(step)
            if not step.is_copied_context and step.llm_call_count != 0:
                metrics = step.metrics
                reward = (step.extra or {}).get("reward")
                out.append(
                    AtifCall(
                        step_id=step.step_id,
                        messages=list(history),
                        reply=reply,
                        tools=ours.get("tools", default_tools),
                        tool_choice=ours.get("tool_choice"),
                        reward=float(reward) if isinstance(reward, int | float) else None,
                        prompt_ids=metrics.prompt_token_ids if metrics else None,
                        completion_ids=metrics.completion_token_ids if metrics else None,
                        logprobs=metrics.logprobs if metrics else None,
                        model_name=step.model_name or trajectory.agent.model_name,
                        agent_name=ours.get("agent_name"),
                    )
                )
            history.append(reply)
        history.extend(_observations(step))
    return out


def trajectory_reward(trajectory: atif.Trajectory) -> float | None:
    """The trajectory's final reward (``extra.reward``; ``None`` when it has none)."""
    value = (trajectory.extra or {}).get("reward")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def read_atif(path: str | Path) -> list[atif.Trajectory]:
    """The trajectories of an ATIF file, validated: one JSON document, a JSON list of them, or
    JSON lines (one per line, as ``agentbolt export --format atif`` writes).

    Raises:
        UserError: the file is not JSON, or a document is not a valid ATIF trajectory (the
            message names the line and the field).
    """
    atif = _atif()
    from pydantic import ValidationError

    text = Path(path).read_text(encoding="utf-8")
    documents: list[tuple[str, Any]] = []
    whole: Any = None
    if not str(path).endswith(".jsonl"):
        try:
            whole = json.loads(text)
        except ValueError:
            whole = None
    if isinstance(whole, list):
        documents = [(f"{path}[{i}]", d) for i, d in enumerate(whole)]
    elif isinstance(whole, dict):
        documents = [(str(path), whole)]
    else:
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                documents.append((f"{path}:{n}", json.loads(line)))
            except ValueError as exc:
                raise UserError(f"{path}:{n} is not JSON ({exc}): expected ATIF documents, one per line") from None
    out = []
    for where, doc in documents:
        try:
            out.append(atif.Trajectory.model_validate(doc))
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise UserError(
                f"{where} is not a valid ATIF trajectory: {loc + ': ' if loc else ''}{first['msg']}"
            ) from None
    return out
