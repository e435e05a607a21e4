"""Demonstrations: model calls to imitate, as the token sequences the policy server would serve.

A :class:`Demonstration` is one chat request an agent sent (messages, tools, ``tool_choice``) and
the assistant reply to learn for it (content and/or tool calls): a stronger model's call from a
successful rollout, or a worked solution played through the agent. Supervised fine-tuning on
them warm-starts a policy that does not yet do what RL should then refine (e.g. call a tool).

:func:`render_demonstration` turns one into a :class:`~agentbolt.types.Transition` whose

- ``prompt_ids`` are what the policy server builds for that request
  (:func:`~agentbolt_torch.chat.render_request`, tokenized as the server tokenizes it: tools in
  the template or in the system prompt, earlier tool calls as text, a forced tool-call start);
- ``response_ids`` are the reply as the policy would generate it
  (:func:`~agentbolt_torch.chat.reply_text`, then the end-of-sequence token), checked to parse
  back -- with the server's own :func:`~agentbolt_torch.chat.parse_tool_calls` -- into the same
  content and tool calls, and to decode back to the same text.

So the fine-tuned policy produces exactly what the served agent parses. A call that fails a check
is skipped with a reason (:func:`render_demonstrations` counts them), never trained as it is.

:func:`demonstrations_from_spans` reads demonstrations from a store: the gateway's LLM-call spans
of the rollouts whose final reward reaches a threshold (e.g. after
``Trainer(agent).dev(tasks, llm=teacher_url)``, or traces of a deployed agent ingested over OTLP);
:func:`demonstrations_from_jsonl` from chat JSONL (``agentbolt export --format chat-jsonl``) and
:func:`demonstrations_from_atif` from ATIF trajectories. ``TorchSFT(demonstrations=...)`` trains on them.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentbolt import types as t
from agentbolt.errors import UserError

from ..chat import parse_tool_calls, render_request, reply_text

__all__ = [
    "Demonstration",
    "demonstrations_from_atif",
    "demonstrations_from_jsonl",
    "demonstrations_from_spans",
    "render_demonstration",
    "render_demonstrations",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Demonstration:
    """One model call to imitate: the chat request as the agent sent it and the reply to learn."""

    messages: list[dict[str, Any]]
    """The request's OpenAI ``messages``."""
    reply: dict[str, Any]
    """The assistant message to learn: ``content`` and/or ``tool_calls`` (OpenAI's shape)."""
    tools: list[dict[str, Any]] | None = None
    """The request's ``tools``."""
    tool_choice: Any = None
    """The request's ``tool_choice``."""
    episode: str = ""
    """Calls of one episode (e.g. a rollout id) share it; training batches never split an episode."""
    index: int = 0
    """Order of the call within its episode."""
    task_id: str | None = None
    agent_name: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


class DemonstrationError(UserError):
    """A demonstration cannot be rendered into what the policy server would serve."""


def _same_calls(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> bool:
    def key(calls: Sequence[Mapping[str, Any]]) -> list[tuple[str, Any]]:
        out = []
        for call in calls:
            fn = call.get("function") or {}
            args = fn.get("arguments")
            if isinstance(args, str):
                try:
                    args = json.loads(args) if args.strip() else {}
                except json.JSONDecodeError:
                    pass
            out.append((str(fn.get("name", "")), args if args is not None else {}))
        return out

    return key(a) == key(b)


def render_demonstration(tokenizer: Any, demo: Demonstration, *, eos_token_id: int | None = None) -> t.Transition:
    """``demo`` as a transition of exactly the tokens the policy server would see and parse.

    Args:
        tokenizer: the policy's tokenizer (with its chat template).
        demo: the call to render.
        eos_token_id: the token that ends the reply (default: the tokenizer's end-of-sequence
            token, which the policy server's engine stops on).

    Raises:
        DemonstrationError: the reply has tool calls but the request offered no tools, it does
            not begin with the forced tool-call start, it would not parse back into the same
            content and calls, or its tokens do not decode back to its text.
    """
    eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
    if eos is None:
        raise DemonstrationError("the tokenizer has no end-of-sequence token: pass eos_token_id")
    rendered = render_request(tokenizer, demo.messages, demo.tools, demo.tool_choice)
    calls = list(demo.reply.get("tool_calls") or [])
    if calls and not rendered.use_tools:
        raise DemonstrationError("the reply calls a tool but the request offered none (the server would not parse it)")
    text = reply_text(demo.reply, rendered.forced)
    if rendered.use_tools:
        parsed = parse_tool_calls(rendered.forced + text)
        content = demo.reply.get("content") if isinstance(demo.reply.get("content"), str) else None
        if not _same_calls(parsed.tool_calls, calls) or (parsed.content or "").strip() != (content or "").strip():
            raise DemonstrationError(f"the reply would not parse back into the same message: {text[:80]!r}")
    if not text:
        raise DemonstrationError("the reply is empty")
    prompt_ids = list(tokenizer(rendered.text, add_special_tokens=False)["input_ids"])
    response_ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if tokenizer.decode(response_ids, skip_special_tokens=False) != text:
        raise DemonstrationError(f"the reply's tokens do not decode back to its text: {text[:80]!r}")
    return t.Transition(
        rollout_id=demo.episode,
        task_id=demo.task_id,
        index=demo.index,
        agent_name=demo.agent_name,
        prompt_ids=prompt_ids,
        response_ids=[*response_ids, int(eos)],
        advantage=1.0,
        token_source=t.TokenSource.RETOKENIZED,
        metadata={"demonstration": True, **demo.metadata},
    )


def render_demonstrations(
    tokenizer: Any,
    demos: Sequence[Demonstration],
    *,
    max_len: int | None = None,
    eos_token_id: int | None = None,
) -> tuple[list[t.Transition], dict[str, int]]:
    """The demonstrations that render (:func:`render_demonstration`), and why the others did not.

    ``max_len`` skips calls whose prompt and reply together are longer (the model's context).
    Returns ``(transitions, {reason: count})``.
    """
    out: list[t.Transition] = []
    skipped: Counter[str] = Counter()
    for demo in demos:
        try:
            transition = render_demonstration(tokenizer, demo, eos_token_id=eos_token_id)
        except UserError as exc:  # DemonstrationError, or a message the chat template cannot render
            skipped[str(exc).split(":")[0]] += 1
            continue
        if max_len is not None and len(transition.prompt_ids) + len(transition.response_ids) > max_len:
            skipped[f"longer than the context ({max_len} tokens)"] += 1
            continue
        out.append(transition)
    return out, dict(skipped)


def demonstrations_from_spans(
    rollouts: Sequence[t.Rollout],
    spans: Mapping[str, Sequence[t.Span]],
    *,
    threshold: float = 1.0,
    best_k: int | None = None,
) -> list[Demonstration]:
    """The chat calls of the rollouts whose final reward is at least ``threshold`` (with
    ``best_k``: only the ``best_k`` best of each task), in call order.

    Each call is read by :func:`agentbolt.runs.chat_calls.rollout_chat_calls`: from its gateway
    span (the request's messages, tools and ``tool_choice``, and the reply), or -- for a traced
    rollout, whose calls only an instrumentation recorded (OpenInference, OpenLLMetry, AgentOps
    spans ingested over OTLP) -- from its instrumentation LLM span. No token ids are needed:
    :func:`render_demonstration` renders each call for the policy. Failed calls, text
    completions and calls without recorded messages are left out (logged).
    """
    from agentbolt.runs.chat_calls import rollout_chat_calls, select_rollouts

    demos: list[Demonstration] = []
    empty = 0
    for rollout in select_rollouts(rollouts, min_reward=threshold, best_k=best_k):
        calls = rollout_chat_calls(rollout, spans.get(rollout.rollout_id, ()))
        empty += not calls
        demos.extend(
            Demonstration(
                messages=call.messages,
                reply={k: v for k, v in call.reply.items() if k in ("role", "content", "tool_calls")},
                tools=call.tools,
                tool_choice=call.tool_choice,
                episode=rollout.rollout_id,
                index=call.index,
                task_id=rollout.task_id,
                agent_name=call.agent_name,
            )
            for call in calls
        )
    if empty:
        log.warning("demonstrations: %d rollouts have no chat call with recorded messages", empty)
    return demos


def demonstrations_from_jsonl(path: str | Path, *, min_reward: float | None = None) -> list[Demonstration]:
    """Demonstrations from a chat JSONL file (``agentbolt export --format chat-jsonl``, or any
    file of ``{"messages": [..., assistant reply], "tools": [...]}`` lines, TRL's conversational
    format): each line's last message is the reply to learn, the messages before it the request.
    ``min_reward`` keeps the lines whose ``reward`` is at least this (lines without one fail it).

    Raises:
        UserError: a line is not JSON, or its last message is not an assistant message.
    """
    demos: list[Demonstration] = []
    with Path(path).open(encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}:{n} is not JSON ({exc})") from None
            messages = record.get("messages") if isinstance(record, dict) else None
            if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
                raise UserError(f"{path}:{n}: expected an object with a non-empty 'messages' list")
            if messages[-1].get("role") != "assistant":
                raise UserError(f"{path}:{n}: the last message must be the assistant reply to learn")
            reward = record.get("reward")
            if min_reward is not None and not (isinstance(reward, int | float) and reward >= min_reward):
                continue
            demos.append(
                Demonstration(
                    messages=messages[:-1],
                    reply={k: v for k, v in messages[-1].items() if k in ("role", "content", "tool_calls")},
                    tools=record.get("tools") or None,
                    tool_choice=record.get("tool_choice"),
                    episode=str(record.get("rollout_id") or f"{path}:{n}"),
                    index=int(record.get("index") or 0),
                    task_id=record.get("task_id"),
                    agent_name=record.get("agent_name"),
                )
            )
    return demos


def demonstrations_from_atif(trajectories: Sequence[Any], *, threshold: float | None = None) -> list[Demonstration]:
    """Demonstrations from ATIF trajectories (``atif.Trajectory``, e.g.
    :func:`agentbolt.runs.atif_export.read_atif` of ``agentbolt export --format atif`` or of
    another tool's files): each agent step made by a model (copied context left out, as ATIF
    requires of SFT data) becomes a call to imitate. ``threshold`` keeps the trajectories whose
    ``extra.reward`` is at least this."""
    from agentbolt.runs.atif_export import trajectory_calls, trajectory_reward

    demos: list[Demonstration] = []
    for i, trajectory in enumerate(trajectories):
        reward = trajectory_reward(trajectory)
        if threshold is not None and (reward is None or reward < threshold):
            continue
        episode = trajectory.trajectory_id or trajectory.session_id or f"trajectory-{i}"
        extra = trajectory.extra or {}
        for index, call in enumerate(trajectory_calls(trajectory)):
            demos.append(
                Demonstration(
                    messages=call.messages,
                    reply={k: v for k, v in call.reply.items() if k in ("role", "content", "tool_calls")},
                    tools=call.tools,
                    tool_choice=call.tool_choice,
                    episode=episode,
                    index=index,
                    task_id=extra.get("task_id") if isinstance(extra.get("task_id"), str) else None,
                    agent_name=call.agent_name,
                )
            )
    return demos
