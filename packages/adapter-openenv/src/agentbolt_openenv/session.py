"""One OpenEnv session: the episode of one rollout on an OpenEnv environment server.

OpenEnv's session contract: a WebSocket to ``{server}/ws`` is one session, with its own
environment instance on the server (``HTTPEnvServer`` creates it when the socket opens and
destroys it when the socket closes); ``reset``, ``step`` and ``state`` messages run on that
instance. :func:`open_session` opens one with OpenEnv's own client
(:class:`openenv.core.GenericEnvClient`, actions and observations as JSON objects) and closes it
on exit, so every rollout has a session of its own and concurrent rollouts never share one.

:class:`OpenEnvSession` records each step as an observation span of the rollout and turns the
environment's rewards into agentbolt rewards (the rule: :class:`RewardRule`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from agentbolt.capture.emit import emit_observation, emit_reward
from agentbolt.errors import UserError

from .errors import OpenEnvActionError, OpenEnvServerError, OpenEnvStepError

__all__ = ["EnvStep", "OpenEnvSession", "RewardRule", "open_session"]

logger = logging.getLogger(__name__)

RewardRule = Literal["terminal", "sum"]
"""How the environment's rewards become agentbolt rewards.

``"terminal"`` (default): the reward of the step that ends the episode (``done``) is the
rollout's final reward; every earlier step's reward is an intermediate reward of the LLM call
that chose that step's action. Each reward the environment gave counts once: ``credit="final"``
trains every call on the terminal reward, ``credit="discounted"`` (gamma = 1) on the sum of the
rewards from its step on. An episode cut by ``max_turns`` (or left by the loop) before ``done``
has no terminal step: its final reward is the agent's ``truncated_reward`` (default 0.0).

``"sum"``: the final reward is the sum of every step's reward (the episode return) and no
intermediate reward is recorded (it would count twice); an episode cut before ``done`` with no
reward at all (no valid action, say) gets ``truncated_reward``. For environments with dense
rewards trained with ``credit="final"``.
"""

_SERVER_ERROR = re.compile(r"^Server error: (?P<message>.*) \(code: (?P<code>[A-Za-z_.]+)\)$", re.DOTALL)
_SESSION_CODES = {"CAPACITY_REACHED", "FACTORY_ERROR", "SESSION_ERROR", "INVALID_JSON", "UNKNOWN_TYPE"}
START_HINT = (
    "start the environment server first, in OpenEnv's Python server mode (no Docker): "
    "`uvicorn <your_env>.server.app:app --host 127.0.0.1 --port <port>` or `python -m <your_env>.server.app`, "
    "or pass the URL it listens on"
)


@dataclass(frozen=True)
class EnvStep:
    """One step of an episode: the action sent and what the server answered."""

    index: int
    """1 for the first step after ``reset``."""
    action: dict[str, Any]
    """The action, as sent (a JSON object of the environment's action schema)."""
    observation: dict[str, Any]
    """The observation's fields (``reward`` and ``done`` are below)."""
    reward: float | None
    """The step's reward, ``None`` when the environment gave none."""
    done: bool
    """The episode ended with this step."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """The observation's metadata, as the server sent it."""


def _code_of(exc: BaseException) -> tuple[str, str] | None:
    """``(code, message)`` of an OpenEnv server error frame, as ``EnvClient`` raises it."""
    match = _SERVER_ERROR.match(str(exc)) if isinstance(exc, RuntimeError) else None
    if match is None:
        return None
    return match["code"].rsplit(".", 1)[-1], match["message"]


class OpenEnvSession:
    """The episode of one rollout on one OpenEnv server session.

    An agent loop reads :attr:`observation` and calls :meth:`step` until :attr:`over`. Made by
    :func:`open_session`; :class:`~agentbolt_openenv.OpenEnvAgent` opens one per rollout.
    """

    def __init__(
        self,
        client: Any,
        *,
        base_url: str,
        max_turns: int,
        reward_rule: RewardRule = "terminal",
        action_schema: Mapping[str, Any] | None = None,
    ) -> None:
        if max_turns < 1:
            raise UserError(f"max_turns must be at least 1, got {max_turns}")
        if reward_rule not in ("terminal", "sum"):
            raise UserError(f"reward_rule must be 'terminal' or 'sum', got {reward_rule!r}")
        self._client = client
        self.base_url = base_url
        """The server's base URL."""
        self.max_turns = max_turns
        """At most this many steps (and, in the default loop, model calls) per episode."""
        self.reward_rule: RewardRule = reward_rule
        self.action_schema: dict[str, Any] | None = None if action_schema is None else dict(action_schema)
        """The environment's action schema (JSON Schema, from ``GET /schema``), when known."""
        self.observation: dict[str, Any] = {}
        """The latest observation (of ``reset``, then of each step)."""
        self.reset_reward: float | None = None
        """The reward ``reset`` returned (usually ``None``; not an agentbolt reward: no call preceded it)."""
        self.done = False
        """The environment ended the episode."""
        self.steps: list[EnvStep] = []
        """Every step so far, in order."""
        self.refused_actions = 0
        """Actions the server refused (:class:`OpenEnvActionError`)."""
        self.last_call_span_id: str | None = None
        """The gateway span id of the latest model call answered in this episode (see :meth:`note_call`)."""
        self._reset = False

    def note_call(self, span_id: str) -> None:
        """A model call of this episode was answered; its gateway span id (the ``X-Agentbolt-Span-Id``
        response header). The next step's reward is credited to it. The agent's OpenAI client
        calls this for every answer, so a loop never needs to."""
        self.last_call_span_id = span_id

    @property
    def over(self) -> bool:
        """The episode is over: the environment said ``done``, or ``max_turns`` steps were taken."""
        return self.done or len(self.steps) >= self.max_turns

    @property
    def truncated(self) -> bool:
        """The environment has not said ``done`` (the episode was cut at ``max_turns``, or the loop stopped)."""
        return not self.done

    async def reset(self, **kwargs: Any) -> dict[str, Any]:
        """Start the episode: ``reset`` with ``kwargs`` (``seed``, ``episode_id``, the environment's
        own options); returns the first observation. Resetting again starts a new episode on the
        same session (the steps so far are forgotten)."""
        result = await self._call("reset", self._client.reset(**kwargs))
        self._reset = True
        self.steps = []  # a new episode on the same session starts afresh
        self.refused_actions = 0
        self.observation = dict(result.observation or {})
        self.reset_reward = None if result.reward is None else float(result.reward)
        self.done = bool(result.done)
        emit_observation(
            {"reset": kwargs, "observation": self.observation, "reward": result.reward, "done": self.done},
            attributes={"openenv.step": 0, "openenv.done": self.done},
        )
        return self.observation

    async def step(self, action: Mapping[str, Any]) -> EnvStep:
        """Send ``action`` (a JSON object of the environment's action schema); returns the step.

        Raises :class:`OpenEnvActionError` when the server refuses the action (the episode is
        unchanged), :class:`OpenEnvStepError` when the environment raised, and
        :class:`OpenEnvServerError` when the session is gone. Under the ``"terminal"`` rule a
        reward of a step that does not end the episode is recorded here, as an intermediate
        reward of the model call answered last (:meth:`note_call`): the one that chose the action.
        """
        if not self._reset:
            raise UserError("step() before reset(): an OpenEnv episode starts with reset")
        if self.over:
            raise UserError(
                f"the episode is over ({'done' if self.done else f'max_turns={self.max_turns} steps taken'}): "
                "check session.over before stepping"
            )
        if not isinstance(action, Mapping):
            raise UserError(f"an OpenEnv action is a JSON object (a dict), got {type(action).__name__}")
        sent = dict(action)
        try:
            result = await self._call("step", self._client.step(sent))
        except OpenEnvActionError:
            self.refused_actions += 1
            raise
        step = EnvStep(
            index=len(self.steps) + 1,
            action=sent,
            observation=dict(result.observation or {}),
            reward=None if result.reward is None else float(result.reward),
            done=bool(result.done),
            metadata=dict(result.metadata or {}),
        )
        self.steps.append(step)
        self.observation = step.observation
        self.done = step.done
        emit_observation(
            {"action": sent, "observation": step.observation, "reward": step.reward, "done": step.done},
            attributes={"openenv.step": step.index, "openenv.done": step.done},
        )
        if self.reward_rule == "terminal" and not step.done and step.reward is not None:
            # credited to the call that chose the action by its span id: spans of the agent and of the
            # gateway reach the store in batches, so their order there is no proof of which came first
            emit_reward(step.reward, target_span_id=self.last_call_span_id, attributes={"openenv.step": step.index})
        return step

    async def state(self) -> dict[str, Any]:
        """The environment's state (``episode_id``, ``step_count`` and its own fields)."""
        return dict(await self._call("state", self._client.state()) or {})

    def final_reward(self, truncated_reward: float | None = 0.0) -> float | None:
        """The rollout's final reward under :attr:`reward_rule` (see :data:`RewardRule`).

        ``"terminal"``: the reward of the step that ended the episode (``None`` if it gave
        none); ``truncated_reward`` when the episode never ended. ``"sum"``: the sum of the
        steps' rewards; when no step gave one, ``None`` if the episode ended, else ``truncated_reward``.
        """
        if self.reward_rule == "sum":
            rewards = [s.reward for s in self.steps if s.reward is not None]
            if rewards:
                return float(sum(rewards))
            return None if self.done else truncated_reward
        if self.done:
            return self.steps[-1].reward if self.steps else self.reset_reward
        return truncated_reward

    async def _call(self, what: str, pending: Any) -> Any:
        # EnvClient reconnects a closed socket before sending, which would open a new session (a
        # fresh, un-reset environment) in the middle of the episode: refuse instead.
        ws = getattr(self._client, "_ws", None)
        if self._reset and (ws is None or getattr(getattr(ws, "state", None), "name", "OPEN") != "OPEN"):
            _close_quietly(pending)
            raise OpenEnvServerError(
                f"the OpenEnv session at {self.base_url} was closed before {what} (the server stopped, restarted "
                "or dropped the session): this episode cannot go on; check the server's log",
                url=self.base_url,
            )
        try:
            return await pending
        except TimeoutError as exc:
            raise OpenEnvServerError(
                f"the OpenEnv server at {self.base_url} did not answer {what} within the client's message timeout: "
                "the environment is slow or stuck; raise OpenEnvAgent(message_timeout_s=...) or check the server",
                url=self.base_url,
            ) from exc
        except RuntimeError as exc:
            coded = _code_of(exc)
            if coded is None:
                raise
            code, message = coded
            if code == "VALIDATION_ERROR":
                raise OpenEnvActionError(
                    f"the OpenEnv server at {self.base_url} refused the {what}: {message} (it does not match the "
                    "environment's action schema, GET /schema)",
                    url=self.base_url,
                    code=code,
                ) from exc
            if code == "CAPACITY_REACHED":
                raise OpenEnvServerError(
                    f"the OpenEnv server at {self.base_url} refused a new session: {message}. Each rollout in "
                    "flight holds one session: start the server with max_concurrent_envs at least the runners' "
                    "concurrency (and SUPPORTS_CONCURRENT_SESSIONS = True on the environment), or lower "
                    "RunnerOptions(concurrency=...)",
                    url=self.base_url,
                    code=code,
                ) from exc
            if code in _SESSION_CODES:
                raise OpenEnvServerError(
                    f"the OpenEnv server at {self.base_url} failed the session ({code}): {message}",
                    url=self.base_url,
                    code=code,
                ) from exc
            raise OpenEnvStepError(
                f"the environment at {self.base_url} raised in {what} ({code}): {message}",
                url=self.base_url,
                code=code,
            ) from exc
        except Exception as exc:
            if type(exc).__module__.startswith("websockets"):
                raise OpenEnvServerError(
                    f"the connection to the OpenEnv server at {self.base_url} broke during {what} ({exc!r}): the "
                    "server stopped or dropped the session; check the server's log",
                    url=self.base_url,
                ) from exc
            raise


def _close_quietly(pending: Any) -> None:
    close = getattr(pending, "close", None)
    if callable(close):
        close()


@asynccontextmanager
async def open_session(
    base_url: str,
    *,
    max_turns: int,
    reward_rule: RewardRule = "terminal",
    connect_timeout_s: float = 10.0,
    message_timeout_s: float = 60.0,
    action_schema: Mapping[str, Any] | None = None,
) -> AsyncIterator[OpenEnvSession]:
    """Open one session on the OpenEnv server at ``base_url`` (``http://`` or ``ws://``) and close
    it on exit: the server then destroys the session's environment instance."""
    from openenv.core import GenericEnvClient

    client = GenericEnvClient(
        base_url=base_url, connect_timeout_s=connect_timeout_s, message_timeout_s=message_timeout_s
    )
    try:
        await client.connect()
    except ConnectionError as exc:
        raise OpenEnvServerError(
            f"no OpenEnv server answered at {base_url} ({exc.__cause__ or exc}): {START_HINT}", url=base_url
        ) from exc
    try:
        yield OpenEnvSession(
            client, base_url=base_url, max_turns=max_turns, reward_rule=reward_rule, action_schema=action_schema
        )
    finally:
        try:
            await client.close()
        except Exception:  # the session is over either way; never hide the episode's own error
            logger.warning("closing the OpenEnv session at %s failed", base_url, exc_info=True)
