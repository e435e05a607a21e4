"""Online RL from a deployed agent: ``agentbolt serve``.

Live clients call the gateway (Chat Completions, Responses, Messages, streaming); every call is
recorded with exact token ids into a **session** (:mod:`.sessions`); ``POST /v1/feedback``
attaches rewards minutes or days later (:mod:`.feedback`); a judge scores the sessions nobody
rated (:mod:`.judging`, :mod:`agentbolt.rewards`); a background trainer turns rewarded sessions
into LightningRL rows and updates the policy (:mod:`.training`); a held-out gate decides whether
the new version goes live (:mod:`.gate`); the gateway swaps to it without pausing live traffic.

    from agentbolt.online import OnlineServer, GateOptions

    async with OnlineServer("sqlite:///serve.db", my_policy,
                            gate=GateOptions(agent=my_agent, tasks=held_out)) as server:
        ...   # clients: OpenAI(base_url=server.url, api_key=...)

``my_policy`` is an :class:`OnlinePolicy` (the model backend that serves and trains; a URL instead
records sessions and feedback without training). ``agentbolt serve`` is the same from the command
line; docs/online.md is the guide.
"""

from __future__ import annotations

from .feedback import Feedback, FeedbackResult
from .gate import GateDecision, GateScore, decide
from .keys import SESSION_HEADER, TASK_HEADER
from .options import GateOptions, JudgeOptions, SessionOptions, UpdateOptions, online_lightningrl
from .policy import OnlinePolicy, StaticPolicy
from .serve import OnlineServer, serve
from .sessions import Session, SessionBook

__all__ = [
    "SESSION_HEADER",
    "TASK_HEADER",
    "Feedback",
    "FeedbackResult",
    "GateDecision",
    "GateOptions",
    "GateScore",
    "JudgeOptions",
    "OnlinePolicy",
    "OnlineServer",
    "Session",
    "SessionBook",
    "SessionOptions",
    "StaticPolicy",
    "UpdateOptions",
    "decide",
    "online_lightningrl",
    "serve",
]
