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
``Trainer(agent).dev(tasks, llm=teacher_url)``). ``TorchSFT(demonstrations=...)`` trains on them.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.errors import UserError
from agentbolt.lightningrl.spans import is_gateway_call, parse_json_attr

from ..chat import parse_tool_calls, render_request, reply_text

__all__ = ["Demonstration", "demonstrations_from_spans", "render_demonstration", "render_demonstrations"]

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
    rollouts: Sequence[t.Rollout], spans: Mapping[str, Sequence[t.Span]], *, threshold: float = 1.0
) -> list[Demonstration]:
    """The chat calls of the rollouts whose final reward is at least ``threshold``, in call order.

    Each call comes from its gateway span: the request's messages (``gen_ai.input.messages``),
    tools and ``tool_choice`` (``agentbolt.llm.request``) and the reply
    (``gen_ai.output.messages``). Failed calls and text completions are left out (logged).
    """
    demos: list[Demonstration] = []
    left_out: Counter[str] = Counter()
    for rollout in rollouts:
        if rollout.final_reward is None or rollout.final_reward < threshold:
            continue
        calls = sorted((s for s in spans.get(rollout.rollout_id, ()) if is_gateway_call(s)), key=lambda s: s.seq or 0)
        for index, span in enumerate(calls):
            if span.status.code == t.StatusCode.ERROR:
                left_out["failed call"] += 1
                continue
            if span.attributes.get(semconv.GEN_AI_OPERATION_NAME) != semconv.OP_CHAT:
                left_out["not a chat call"] += 1
                continue
            messages = parse_json_attr(span, semconv.GEN_AI_INPUT_MESSAGES)
            outputs = parse_json_attr(span, semconv.GEN_AI_OUTPUT_MESSAGES)
            request = parse_json_attr(span, semconv.LLM_REQUEST) or {}
            if not isinstance(messages, list) or not messages or not isinstance(outputs, list) or not outputs:
                left_out["no messages recorded"] += 1
                continue
            reply = {k: v for k, v in dict(outputs[0]).items() if k in ("role", "content", "tool_calls")}
            demos.append(
                Demonstration(
                    messages=messages,
                    reply=reply,
                    tools=request.get("tools") or None,
                    tool_choice=request.get("tool_choice"),
                    episode=rollout.rollout_id,
                    index=index,
                    task_id=rollout.task_id,
                    agent_name=span.attributes.get(semconv.GEN_AI_AGENT_NAME),
                )
            )
    if left_out:
        log.warning("demonstrations: left out %s", ", ".join(f"{n} {why}" for why, n in left_out.items()))
    return demos
