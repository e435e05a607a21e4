"""Policies by role for the SQL agent: one LoRA adapter for the writer, one for the rewriter.

``train.py --policies per-role`` passes these to the Trainer; ``--policies shared`` trains one
adapter for both (the checker is never trained either way).

The gateway routes each call to its role's adapter when the call is made, so it must know the
role then. The agent sends no header and its three LLM calls share one system prompt; what tells
them apart is the last user message, which follows one of the agent's templates. :func:`sql_role`
names the call from it, with no change to the agent. The LangGraph adapter names the same calls
after their graph node when the spans are recorded; LightningRL leaves out any call the two
disagree on (``policy_mismatch``), so a wrong rule can cost data but never train the wrong adapter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent import CHECK, CORRECT, REWRITE

from agentbolt.capture.roles import content_text
from agentbolt.policies import Policies, match

REWRITE_MARK = "\nWrong query: "
"""In the rewriter's prompt (agent.REWRITE) and in no other."""
CHECK_MARK = f"Reply {CORRECT} if the query answers the question"
"""In the checker's prompt (agent.CHECK) and in no other."""
assert REWRITE_MARK in REWRITE and REWRITE_MARK not in CHECK
assert CHECK_MARK in CHECK and CHECK_MARK not in REWRITE

NODES = {"writer": "write_query", "rewriter": "rewrite_query", "checker": "check_query"}
"""Each role's LangGraph node: the name the adapter records for its calls."""


def sql_role(request: Mapping[str, Any]) -> str | None:
    """The graph node that made a Chat Completions request, from its last user message."""
    users = [m for m in request.get("messages") or () if isinstance(m, Mapping) and m.get("role") == "user"]
    if not users:
        return None
    last = content_text(users[-1].get("content"))
    if REWRITE_MARK in last:
        return NODES["rewriter"]
    if CHECK_MARK in last:
        return NODES["checker"]
    return NODES["writer"]


def policies_for(kind: str, *, rank: int) -> Policies | None:
    """``shared``: ``None`` (one policy for every call; the checker's calls are not trained, by
    ``agent_match``); ``per-role``: an adapter of rank ``rank`` for the writer and one for the
    rewriter (the checker: the base model, never trained)."""
    if kind == "shared":
        return None
    if kind == "per-role":
        return Policies(
            {
                "writer": match(NODES["writer"], rank=rank),
                "rewriter": match(NODES["rewriter"], rank=rank),
            }
        )
    raise ValueError(f"--policies is shared or per-role, got {kind!r}")
