"""An OpenEnv environment server as an agentbolt agent: ``Trainer(OpenEnvAgent(url), ...)``.

Each rollout opens its own session on the server (:func:`~agentbolt_openenv.session.open_session`),
resets it with the task's arguments (:mod:`agentbolt_openenv.tasks`), runs the agent loop (yours,
or :class:`~agentbolt_openenv.loop.ReActLoop`) with an OpenAI client on the rollout's gateway URL,
closes the session and returns the final reward (:data:`~agentbolt_openenv.session.RewardRule`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentbolt.capture.emit import emit_message
from agentbolt.capture.tracing import current_rollout
from agentbolt.errors import UserError
from agentbolt.types import Resources

from .errors import OpenEnvServerError
from .loop import EpisodeLoop, ReActLoop
from .session import START_HINT, RewardRule, open_session
from .tasks import http_url, reset_kwargs

__all__ = ["OpenEnvAgent", "check_server"]

logger = logging.getLogger(__name__)

GATEWAY_SPAN_HEADER = "x-agentbolt-span-id"
"""The response header in which agentbolt's gateway sends the span id of a call."""


def check_server(base_url: str, *, timeout_s: float = 10.0) -> dict[str, Any]:
    """Check that an OpenEnv server answers at ``base_url``; returns its schemas (``GET /schema``:
    ``action``, ``observation``, ``state``). Raises :class:`OpenEnvServerError` naming the URL."""
    import httpx

    url = http_url(base_url)
    try:
        with httpx.Client(base_url=url, timeout=timeout_s) as http:
            http.get("/health").raise_for_status()
            schema: dict[str, Any] = http.get("/schema").raise_for_status().json()
    except httpx.TransportError as exc:
        raise OpenEnvServerError(f"no OpenEnv server answered at {url} ({exc}): {START_HINT}", url=url) from exc
    except httpx.HTTPStatusError as exc:
        raise OpenEnvServerError(
            f"{url} answered {exc.request.url.path} with {exc.response.status_code}: is it an OpenEnv environment "
            f"server? ({START_HINT})",
            url=url,
        ) from exc
    return schema


async def _fetch_schema(base_url: str, timeout_s: float) -> dict[str, Any] | None:
    import httpx

    url = http_url(base_url)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=timeout_s) as http:
            answer = await http.get("/schema")
    except httpx.TransportError as exc:
        raise OpenEnvServerError(f"no OpenEnv server answered at {url} ({exc}): {START_HINT}", url=url) from exc
    if answer.status_code != 200:
        logger.warning("GET %s/schema answered %s: the agent loop gets no action schema", url, answer.status_code)
        return None
    action = answer.json().get("action")
    return action if isinstance(action, dict) else None


@dataclass
class OpenEnvAgent:
    """The agent of an OpenEnv environment server, for :class:`agentbolt.Trainer`.

    Args:
        base_url: the server (``http://127.0.0.1:8000``; ``ws://`` works too).
        loop: the agent loop, ``async loop(env, llm, model)`` (:class:`~agentbolt_openenv.loop.EpisodeLoop`);
            default :class:`~agentbolt_openenv.loop.ReActLoop` with its defaults.
        max_turns: at most this many steps per episode (and model calls, in the default loop).
        reward_rule: ``"terminal"`` (default) or ``"sum"``: see :data:`~agentbolt_openenv.session.RewardRule`.
        truncated_reward: the final reward of an episode cut by ``max_turns`` before the
            environment said ``done`` (``"terminal"`` rule); ``None`` leaves it missing.
        reset: the task → ``reset`` arguments (default :func:`~agentbolt_openenv.tasks.reset_kwargs`).
        connect_timeout_s / message_timeout_s: OpenEnv client timeouts (opening the session; each answer).

    Each rollout resets with ``episode_id`` ``"{rollout_id}/{attempt_id}"`` unless the task sets
    one, so the server's logs name the agentbolt rollout.
    """

    base_url: str
    loop: EpisodeLoop = field(default_factory=ReActLoop)
    max_turns: int = 8
    reward_rule: RewardRule = "terminal"
    truncated_reward: float | None = 0.0
    reset: Callable[[Any], dict[str, Any]] = reset_kwargs
    connect_timeout_s: float = 10.0
    message_timeout_s: float = 60.0
    _action_schema: dict[str, Any] | None = field(default=None, init=False, repr=False)
    _schema_read: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        http_url(self.base_url)  # a malformed URL is refused now, not in every rollout
        if self.max_turns < 1:
            raise UserError(f"max_turns must be at least 1, got {self.max_turns}")
        if self.reward_rule not in ("terminal", "sum"):
            raise UserError(f"reward_rule must be 'terminal' or 'sum', got {self.reward_rule!r}")
        if not callable(self.loop):
            raise UserError(f"loop must be an async callable loop(env, llm, model), got {self.loop!r}")

    def check(self) -> dict[str, Any]:
        """:func:`check_server` on this agent's server (call it before training: a clear error now)."""
        return check_server(self.base_url, timeout_s=self.connect_timeout_s)

    async def rollout(self, task: Any, resources: Resources) -> float | None:
        """Run one episode: session, reset, loop, close; returns the final reward."""
        import openai

        if resources.llm is None:
            raise UserError("OpenEnvAgent needs an LLM endpoint in the resources (the trainer publishes one)")
        kwargs = self.reset(task)
        ctx = current_rollout()
        if ctx is not None and "episode_id" not in kwargs:
            kwargs["episode_id"] = f"{ctx.rollout_id}/{ctx.attempt_id}"
        if not self._schema_read:
            self._action_schema = await _fetch_schema(self.base_url, self.connect_timeout_s)
            self._schema_read = True
        async with open_session(
            self.base_url,
            max_turns=self.max_turns,
            reward_rule=self.reward_rule,
            connect_timeout_s=self.connect_timeout_s,
            message_timeout_s=self.message_timeout_s,
            action_schema=self._action_schema,
        ) as env:
            await env.reset(**kwargs)

            async def remember_call(response: Any) -> None:
                span_id = response.headers.get(GATEWAY_SPAN_HEADER)
                if span_id:
                    env.note_call(span_id)

            async with (
                openai.DefaultAsyncHttpxClient(event_hooks={"response": [remember_call]}) as http,
                openai.AsyncOpenAI(
                    base_url=resources.llm.base_url,
                    api_key=resources.llm.api_key or "none",
                    max_retries=0,
                    http_client=http,
                ) as llm,
            ):
                await self.loop(env, llm, resources.llm.model)
            if env.truncated:
                emit_message(
                    f"openenv: the episode ended after {len(env.steps)} steps (max_turns={self.max_turns}) "
                    "before the environment said done"
                )
            return env.final_reward(self.truncated_reward)
