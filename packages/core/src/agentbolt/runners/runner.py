"""Runners: claim rollouts from the store and run the user's agent on them.

An agent is a plain function ``agent(task, resources) -> float | None`` (sync or async), or an
object with such a ``rollout`` method. ``task`` is the rollout's input (the dataset item);
``resources.llm.base_url`` is already scoped to the rollout and attempt, so the agent's
OpenAI client needs nothing else. A returned float is recorded as the final reward; ``None``
means rewards were emitted (:func:`agentbolt.capture.emit.emit_reward`) or there are none.

One :class:`Runner` runs up to ``concurrency`` rollouts at once. Agents run away from the
runner's own event loop (:mod:`agentbolt.runners.workers`: sync agents on threads of their own,
async agents on a separate agent loop), so an agent that blocks or never returns cannot stall
heartbeats, deadlines or shutdown. :class:`agentbolt.runners.pool.RunnerPool` starts several
runner processes, watches them and replaces one that dies. Per attempt the runner

- renews its lease with heartbeats; if the store reports the attempt timed out, lost or
  cancelled, the agent task is cancelled;
- cancels the agent at the attempt's deadline (``timeout_s``); the store marks it ``timed_out``;
- on an exception records it (type, message, traceback, as the attempt's error and an exception
  span) and reports the attempt failed: an agent error is final, an infrastructure error
  (gateway/back-end failure) is retried by the store while attempts remain;
- writes every span of the attempt with its end, in one transaction (:mod:`agentbolt.runners.reporter`:
  the ends of attempts that finish together share it).

On SIGTERM or Ctrl-C a runner stops claiming, lets running rollouts finish (``drain_timeout_s``),
then hands the rest back to the store as infrastructure failures so they are retried.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from .. import types as t
from ..capture.adapters import capture_span, instrument_adapters
from ..capture.emit import emit_exception, emit_reward
from ..capture.tracing import RolloutContext, install_otel, rollout_context
from ..environments import environment_agent, is_environment_reference
from ..errors import StaleAttemptError, StoreUnavailableError, UserError
from ..reward_validation import RewardRefused, reward_number
from ..store.base import Store
from ..store.wire import DEFAULT_LEASE_S
from .reporter import Reporter
from .workers import AgentWorkers

__all__ = [
    "AgentLike",
    "Runner",
    "RunnerConfig",
    "RunnerStats",
    "classify_error",
    "import_reference",
    "load_agent",
    "scope_resources",
]

log = logging.getLogger(__name__)

AgentLike = Callable[[Any, t.Resources], Any] | Any
"""A function ``(task, resources) -> float | None`` (sync or async), an object with such a
``rollout`` method, or a ``"module:attribute"`` reference to one."""


def import_reference(reference: str, what: str = "agent") -> Any:
    """The object a ``"package.module:name"`` reference names (``name`` may be dotted); a
    :class:`~agentbolt.errors.UserError` saying what is wrong otherwise."""
    module_name, _, attr = reference.partition(":")
    if not module_name or not attr:
        raise UserError(f"{what} reference must look like 'package.module:{what.lstrip('-')}', got {reference!r}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserError(f"cannot import {module_name!r} for {what} {reference!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UserError(f"{module_name!r} has no attribute {attr!r} ({what} {reference!r})") from None
    return obj


def load_agent(agent: AgentLike | str) -> Callable[[Any, t.Resources], Any]:
    """Resolve an agent reference to its callable (``rollout`` method or the function).

    An environment of another framework (an object a registered environment kind accepts, or a
    ``"KIND://NAME"`` string; see :mod:`agentbolt.environments`) resolves to the agent that runs it.
    """
    if is_environment_reference(agent):
        agent = environment_agent(agent)
    elif isinstance(agent, str):
        agent = import_reference(agent)
    if inspect.isclass(agent):
        agent = agent()  # a class with a no-argument constructor: use an instance
    method = getattr(agent, "rollout", None)
    if callable(method):
        return method
    if callable(agent):
        return agent
    env_agent = environment_agent(agent)
    if env_agent is not None:
        return load_agent(env_agent)
    raise UserError(
        f"an agent must be a function (task, resources) -> float | None or have such a rollout method; got {agent!r}"
    )


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004


def scope_resources(resources: t.Resources, rollout_id: str, attempt_id: str) -> t.Resources:
    """Resources whose ``llm.base_url`` points at the gateway route of one attempt.

    ``llm.base_url`` is the gateway's base (``http://host:port`` or ``http://host:port/v1``);
    the result is ``http://host:port/rollouts/{rollout_id}/attempts/{attempt_id}/v1`` (ids
    percent-encoded, so any rollout id is safe in the path).
    """
    if resources.llm is None:
        return resources
    root = resources.llm.base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    scoped = f"{root}/rollouts/{quote(rollout_id, safe='')}/attempts/{quote(attempt_id, safe='')}/v1"
    llm = resources.llm.model_copy(update={"base_url": scoped})
    return resources.model_copy(update={"llm": llm})


_NO_RESOURCES = t.Resources()
"""What an agent gets while no resources were published (shared: resources are frozen)."""

_INFRA_ERROR_TYPES = {"agentbolt_upstream_error", "agentbolt_paused", "agentbolt_gateway_error"}
_CONNECTION_ERRORS = {
    "APIConnectionError",
    "APITimeoutError",
    "ConnectError",
    "ConnectTimeout",
    "ReadTimeout",
    "RemoteProtocolError",
}


def classify_error(exc: BaseException) -> t.ErrorKind:
    """``INFRASTRUCTURE`` for failures of the gateway or inference back-end anywhere in the
    exception's cause chain (as raised by the OpenAI client or frameworks wrapping it), else
    ``AGENT``."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        names = {c.__name__ for c in type(current).__mro__}
        if names & _CONNECTION_ERRORS:
            return t.ErrorKind.INFRASTRUCTURE
        body = getattr(current, "body", None)  # openai.APIStatusError: the "error" object of the answer
        if isinstance(body, dict):
            inner = body["error"] if isinstance(body.get("error"), dict) else body
            if inner.get("type") in _INFRA_ERROR_TYPES:
                return t.ErrorKind.INFRASTRUCTURE
        if isinstance(current, StoreUnavailableError):
            return t.ErrorKind.INFRASTRUCTURE
        current = current.__cause__ or current.__context__
    return t.ErrorKind.AGENT


@dataclass
class RunnerConfig:
    """How a runner works."""

    concurrency: int = 8
    """Rollouts run at once in this process."""
    lease_s: float = DEFAULT_LEASE_S
    """Lease length; renewed every ``lease_s / 3`` seconds."""
    dequeue_wait_s: float = 1.0
    """How long one claim request waits for queued work."""
    mode: t.RolloutMode | None = None
    """Only claim ``train`` or ``val`` rollouts (default: both)."""
    max_rollouts: int | None = None
    """Stop after starting this many rollouts."""
    exit_when_idle_s: float | None = None
    """Stop after this long with nothing queued and nothing running."""
    drain_timeout_s: float = 30.0
    """On stop, how long running rollouts may take to finish before they are handed back."""
    adapters: list[str] | None = None
    """Framework adapters to instrument: ``None`` every installed one, ``[]`` none."""
    cancel_grace_s: float = 2.0
    """How long an agent whose attempt ended may take to stop before it is abandoned (and, for
    an async agent, its agent loop replaced)."""

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise UserError(f"concurrency must be at least 1, got {self.concurrency}")
        if self.lease_s <= 0:
            raise UserError(f"lease_s must be positive, got {self.lease_s}")


@dataclass
class RunnerStats:
    """What a runner did."""

    started: int = 0
    succeeded: int = 0
    failed: int = 0
    ended_by_store: int = 0
    """Attempts the store ended under the agent (timed out, lost, cancelled)."""
    handed_back: int = 0
    """Attempts returned to the store unfinished at shutdown."""
    abandoned: int = 0
    """Agents that ignored cancellation and were left running on their own thread or loop."""
    errors: dict[str, int] = field(default_factory=dict)


@dataclass
class _Running:
    claim: t.Claim
    task: asyncio.Task[None]
    ended_by: str | None = None
    deadline: asyncio.TimerHandle | None = None


class Runner:
    """Runs an agent on rollouts claimed from a store. See the module docstring.

    Args:
        agent: the agent (function, object with ``rollout``, or ``"module:attr"``).
        store: the store (in this process).
        worker_id: a name for this worker in the store (default: ``host-pid-N``).
        config: :class:`RunnerConfig`.
    """

    def __init__(
        self, agent: AgentLike | str, store: Store, *, worker_id: str | None = None, config: RunnerConfig | None = None
    ) -> None:
        self.agent = load_agent(agent)
        self.is_async = _is_async(self.agent)
        self.store = store
        self.config = config or RunnerConfig()
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{id(self) % 10_000}"
        self.stats = RunnerStats()
        self._running: dict[str, _Running] = {}
        self._stop: asyncio.Event | None = None
        self._resources: dict[int | None, t.Resources | None] = {}
        self._workers: AgentWorkers | None = None
        self._sink: Reporter | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.adapters: list[Any] = []
        self.adapter_failures: list[str] = []
        """``"name: why"`` of adapters that failed to instrument (recorded on every attempt)."""

    def request_stop(self) -> None:
        """Stop claiming; running rollouts get ``drain_timeout_s`` to finish. Thread-safe."""
        if self._stop is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    async def run(
        self, stop: asyncio.Event | None = None, *, on_ready: Callable[[], None] | None = None
    ) -> RunnerStats:
        """Claim and run rollouts until stopped (``stop`` set, :meth:`request_stop`, limits).

        ``on_ready`` is called once the runner is about to claim its first rollouts.
        """
        self._loop = asyncio.get_running_loop()
        self._stop = stop or asyncio.Event()
        install_otel()
        if self.config.adapters is None or self.config.adapters:
            self.adapter_failures = []
            self.adapters = instrument_adapters(self.config.adapters, failures=self.adapter_failures)
        self._sink = Reporter(self.store)
        self._sink.start()
        self._workers = AgentWorkers(f"agentbolt-agent-{self.worker_id}", grace_s=self.config.cancel_grace_s)
        heartbeats = self._loop.create_task(self._heartbeat_loop(), name="agentbolt-heartbeats")
        if on_ready is not None:
            on_ready()
        try:
            await self._claim_loop()
            await self._drain()
        finally:
            heartbeats.cancel()
            await asyncio.gather(heartbeats, return_exceptions=True)
            await self._sink.close()
            self.stats.abandoned = self._workers.abandoned
            self._workers.close()
            for adapter in self.adapters:
                try:
                    adapter.uninstrument()
                except Exception as exc:  # never let cleanup hide the run's outcome
                    log.warning("uninstrumenting the %s adapter failed: %s", adapter.name, exc)
            self.adapters = []
        return self.stats

    async def _claim_loop(self) -> None:
        assert self._stop is not None
        cfg = self.config
        idle_since: float | None = None
        while not self._stop.is_set():
            if cfg.max_rollouts is not None and self.stats.started >= cfg.max_rollouts:
                return
            free = cfg.concurrency - len(self._running)
            if free <= 0:
                await self._wait_for_a_slot()
                continue
            if cfg.max_rollouts is not None:
                free = min(free, cfg.max_rollouts - self.stats.started)
            try:
                claims = await self.store.dequeue(
                    self.worker_id, limit=free, lease_s=cfg.lease_s, mode=cfg.mode, wait_s=cfg.dequeue_wait_s
                )
            except StoreUnavailableError as exc:
                log.warning("runner %s cannot reach the store (%s); retrying", self.worker_id, exc)
                await _sleep_or_stop(self._stop, 1.0)
                continue
            for claim in claims:
                self._start(claim)
            if claims or self._running:
                idle_since = None
            elif cfg.exit_when_idle_s is not None:
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since >= cfg.exit_when_idle_s:
                    return

    async def _wait_for_a_slot(self) -> None:
        assert self._stop is not None
        tasks = [r.task for r in self._running.values()]
        stopper = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()

    def _start(self, claim: t.Claim) -> None:
        aid = claim.attempt.attempt_id
        task = asyncio.get_running_loop().create_task(
            self._run_attempt(claim), name=f"rollout-{claim.rollout.rollout_id}"
        )
        running = self._running[aid] = _Running(claim, task)
        self.stats.started += 1
        if claim.attempt.deadline_at is not None:
            delay = max(0.0, claim.attempt.deadline_at - time.time())
            running.deadline = asyncio.get_running_loop().call_later(delay, self._end, aid, "timed out")
        task.add_done_callback(lambda _task: self._finished(aid))

    def _finished(self, aid: str) -> None:
        running = self._running.pop(aid, None)
        if running is not None and running.deadline is not None:
            running.deadline.cancel()

    def _end(self, aid: str, why: str) -> None:
        """Stop an agent because the store ended (or will end) its attempt."""
        running = self._running.get(aid)
        if running is not None and running.ended_by is None and not running.task.done():
            running.ended_by = why
            running.task.cancel()

    async def _heartbeat_loop(self) -> None:
        period = self.config.lease_s / 3
        while True:
            await asyncio.sleep(period)
            ids = list(self._running)
            if not ids:
                continue
            try:
                states = await self.store.heartbeat(ids, lease_s=self.config.lease_s)
            except Exception as exc:  # keep trying; a lost lease shows up in the next answer
                log.warning("heartbeat failed for %d attempts: %s", len(ids), exc)
                continue
            for state in states:
                if state.status is not t.AttemptStatus.RUNNING:
                    self._end(state.attempt_id, state.status.value if state.error is None else state.error.message)

    async def _resources_for(self, version: int | None) -> t.Resources:
        if version not in self._resources:
            self._resources[version] = await self.store.get_resources(version)
        return self._resources[version] or _NO_RESOURCES

    async def _call_agent(self, task: Any, resources: t.Resources) -> Any:
        assert self._workers is not None
        if self.is_async:
            return await self._workers.call_async(self.agent, task, resources)
        return await self._workers.call_sync(self.agent, task, resources)

    async def _run_attempt(self, claim: t.Claim) -> None:
        rollout, attempt = claim.rollout, claim.attempt
        rid, aid = rollout.rollout_id, attempt.attempt_id
        ctx = RolloutContext(
            rid, aid, self._sink, task_id=rollout.task_id, mode=rollout.mode, group_id=rollout.group_id
        )
        assert self._sink is not None
        try:
            resources = scope_resources(await self._resources_for(rollout.resources_version), rid, aid)
            with rollout_context(ctx):
                if self.adapters or self.adapter_failures:  # for agentbolt doctor
                    ctx.record(capture_span(self.adapters, self.adapter_failures))
                result = await self._call_agent(rollout.input, resources)
                reward = _as_reward(result)
                if reward is not None:
                    emit_reward(reward, final=True)
            await self._sink.finish(aid, t.AttemptStatus.SUCCEEDED, reward=ctx.final_reward)  # with its spans
            self.stats.succeeded += 1
        except asyncio.CancelledError:
            running = self._running.get(aid)
            why = running.ended_by if running is not None else None
            if why is None:
                raise  # the runner itself is being cancelled
            self.stats.ended_by_store += 1
            log.info("rollout %s attempt %s stopped: %s", rid, aid, why)
            with rollout_context(ctx):
                emit_exception(TimeoutError(f"agent stopped: attempt {why}"))
            await self._sink.flush()
            try:  # let the store apply a deadline now rather than at its next sweep
                await self.store.heartbeat([aid], lease_s=self.config.lease_s)
            except Exception:
                pass
        except Exception as exc:
            kind = classify_error(exc)
            self.stats.failed += 1
            self.stats.errors[type(exc).__name__] = self.stats.errors.get(type(exc).__name__, 0) + 1
            log.info("rollout %s attempt %s failed (%s): %r", rid, aid, kind.value, exc)
            with rollout_context(ctx):
                emit_exception(exc)
            try:
                await self._sink.finish(aid, t.AttemptStatus.FAILED, error=t.ErrorInfo.from_exception(exc, kind))
            except StaleAttemptError as stale:
                log.info("%s", stale)
            except Exception as report_exc:
                log.warning("could not report the failure of attempt %s: %s", aid, report_exc)

    async def _drain(self) -> None:
        if not self._running:
            return
        tasks = [r.task for r in self._running.values()]
        log.info(
            "runner %s: waiting up to %.0f s for %d running rollouts",
            self.worker_id,
            self.config.drain_timeout_s,
            len(tasks),
        )
        _, pending = await asyncio.wait(tasks, timeout=self.config.drain_timeout_s)
        for running in [r for r in list(self._running.values()) if r.task in pending]:
            running.ended_by = "handed back: runner stopping"
            running.task.cancel()
            error = t.ErrorInfo(
                kind=t.ErrorKind.INFRASTRUCTURE,
                type="runner_stopped",
                message="the runner stopped before the agent finished",
            )
            try:
                await self.store.finish_attempt(running.claim.attempt.attempt_id, t.AttemptStatus.FAILED, error=error)
                self.stats.handed_back += 1
            except Exception as exc:
                log.warning("could not hand back attempt %s: %s", running.claim.attempt.attempt_id, exc)
        if pending:
            await asyncio.wait(pending, timeout=5)


def _as_reward(result: Any) -> float | None:
    if result is None:
        return None
    try:
        return reward_number(result, "the agent's return value")
    except RewardRefused as exc:
        raise UserError(f"{exc}; an agent returns a finite float reward or None (at most 1e15 in magnitude)") from None


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass
