"""``agentbolt serve`` in Python: the gateway in front of a served policy, for live clients.

    server = OnlineServer(
        "sqlite:///serve.db",
        my_policy,            # or a URL: record only, train elsewhere
        state_dir="serve-state",
        gate=GateOptions(agent=my_agent, tasks=held_out),
        judge=JudgeOptions(judge=LLMJudge(judge_url, "judge-model")),
    )
    await server.start()                         # clients use {server.url}/v1 ...
    ...
    await server.stop()

    serve(...)                                   # the same, blocking until Ctrl-C

What it runs, on one event loop (the model's servers and updates on threads of their own):

- the :class:`~agentbolt.gateway.Gateway` with a :class:`~agentbolt.online.sessions.SessionBook`
  as its call router: Chat Completions, Responses and Messages, streaming or not, every call
  recorded with exact ids into a session (:mod:`.sessions` says how sessions map onto
  rollouts, attempts and spans);
- ``POST /v1/feedback``, ``POST /v1/sessions/close``, ``GET /v1/online/status``
  (:mod:`.api`), behind the same bearer token (required off loopback);
- the judge sweep for sessions nobody rated (:mod:`.judging`);
- the background trainer and the gate (:mod:`.training`, :mod:`.gate`);
- the run's metrics, every ``metrics_every_s`` (sessions, feedback rate, judge scores, live
  version, gate decisions: what the dashboard's Serving page shows).

**Restarts lose nothing**, a ``kill -9`` at any moment included: an answered call is in the
call log (``{state_dir}/calls``) before its last byte is sent (the gateway's ``durable_calls``,
streams included) and in the store after the next background batch or, after a crash, before
the restarted process listens; feedback is
written before it is acknowledged; which sessions were trained, the gate's decisions and the
live version with its checkpoint are in the ledger (``{state_dir}/ledger.jsonl``); open sessions
resume under the same attempt when the process is back within their lease, except those whose
call the stop cut (noted in ``{state_dir}/inflight.log``), which end ``aborted``. ``GET /ready``
answers 200 only once the live policy serves (503 before); ``/v1/online/status`` counters are the
run's, rebuilt from the store on start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import types as t
from ..algorithm import as_tasks
from ..errors import UserError
from ..gateway import Gateway, Upstream
from ..rewards.offline import task_text
from ..store import open_store
from ..store.base import Store
from ..store.run_records import RunSpec
from . import keys
from .api import online_openapi_paths, online_routes
from .evaluation import GateRunner
from .feedback import Feedback, FeedbackResult, record_feedback
from .gate import GateDecision, GateScore, score_from_record
from .inflight import InflightJournal
from .judging import JudgeSweep
from .ledger import Ledger
from .live_schemas import live_openapi_paths
from .options import GateOptions, JudgeOptions, SessionOptions, UpdateOptions
from .policy import OnlinePolicy, StaticPolicy
from .sessions import SessionBook
from .training import OnlineTrainer

__all__ = ["OnlineServer", "serve"]

log = logging.getLogger(__name__)


class OnlineServer:
    """The live gateway, feedback API, judge and background trainer (see the module docstring).

    Args:
        store: a store URL or an open store (its own: the serve process claims its rollouts).
        policy: an :class:`~agentbolt.online.policy.OnlinePolicy`, or an OpenAI-compatible URL
            / :class:`~agentbolt.gateway.Upstream` to serve as is (no training).
        state_dir: the ledger and the live checkpoints.
        host, port: where live clients connect.
        token: bearer token clients send (their API key); required off loopback.
        allowed_hosts: extra ``Host`` names a tokenless server answers.
        run_name: name of the serve run in the store (first start only).
        sessions, updates, gate, judge: option groups (:mod:`agentbolt.online.options`).
        metrics_every_s: how often the run's ``online/*`` metrics are recorded.
        gateway_options: further :class:`~agentbolt.gateway.Gateway` keywords (``sampling``,
            ``request_timeout_s``, ``agent_names``, ...).
    """

    def __init__(
        self,
        store: Store | str,
        policy: OnlinePolicy | Upstream | str,
        *,
        state_dir: str | Path = "agentbolt-serve",
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        allowed_hosts: Sequence[str] = (),
        run_name: str | None = None,
        sessions: SessionOptions | Mapping[str, Any] | None = None,
        updates: UpdateOptions | Mapping[str, Any] | None = None,
        gate: GateOptions | Mapping[str, Any] | None = None,
        judge: JudgeOptions | Mapping[str, Any] | None = None,
        metrics_every_s: float = 10.0,
        gateway_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._store_spec = store
        self.policy: OnlinePolicy = policy if isinstance(policy, OnlinePolicy) else StaticPolicy(policy)
        self.state_dir = Path(state_dir)
        self.host = host
        self.port = port
        self.token = token
        self.allowed_hosts = list(allowed_hosts)
        self.run_name = run_name
        self.session_options = SessionOptions.from_value(sessions, option="sessions") or SessionOptions()
        self.updates = UpdateOptions.from_value(updates, option="updates") or UpdateOptions()
        self.gate = GateOptions.from_value(gate, option="gate")
        self.judge_options = JudgeOptions.from_value(judge, option="judge")
        self.metrics_every_s = metrics_every_s
        self.gateway_options = dict(gateway_options or {})
        if self.gate is not None and not self.policy.trains:
            raise UserError("gate= needs a policy that trains (a fixed upstream never changes)")
        self.ledger = Ledger(self.state_dir)
        self.held_out_keys: set[str] = set()
        if self.gate is not None:
            for task in as_tasks(self.gate.tasks):
                pkey = keys.prompt_key(task_text(task.input))
                if pkey is not None:
                    self.held_out_keys.add(pkey)
        self.run_id = ""
        self.live_version = 0
        self.live_score: GateScore | None = None
        self.trained: set[str] = set()
        self.trained_in: dict[str, int | None] = {}
        """Rollout id of a consumed session -> the live version its update started from."""
        self.decisions: list[dict[str, Any]] = []
        self.swaps: list[dict[str, Any]] = []
        self.feedback_count = {"client": 0, "duplicate": 0}
        self.store: Store = None  # type: ignore[assignment]  # set by start()
        self.gateway: Gateway = None  # type: ignore[assignment]
        self.sessions: SessionBook = None  # type: ignore[assignment]
        self.gate_runner: GateRunner | None = None
        self.judge: JudgeSweep | None = None
        self.trainer: OnlineTrainer | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._baseline: asyncio.Task[GateScore] | None = None
        self._metrics_step = 0
        self._own_store = isinstance(store, str)
        self._serving = False

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> str:
        """Start everything; returns the base URL clients use (``.../v1``)."""
        self.store = open_store(self._store_spec) if isinstance(self._store_spec, str) else self._store_spec
        checkpoint = await self._replay()
        self.sessions = SessionBook(
            self.store,
            self.run_id,
            self.session_options,
            worker_id=f"{self.run_id}-sessions",
            live_version=lambda: self.live_version or None,
            journal=InflightJournal(self.state_dir),
        )
        self.gateway = Gateway(
            self.store,
            [],
            token=self.token,
            allowed_hosts=self.allowed_hosts,
            router=self.sessions,
            routes=online_routes(self),
            openapi_paths={**live_openapi_paths(), **online_openapi_paths()},
            readiness=self.readiness,
            **{"call_log": self.state_dir / "calls", **self.gateway_options},
        )
        await self.gateway.start(self.host, self.port)
        if self.gate is not None:
            self.gate_runner = GateRunner(
                self.store,
                self.run_id,
                self.gate.agent,
                self.gate.tasks,
                samples=self.gate.samples,
                sampling=self.gate.sampling,
                concurrency=self.gate.concurrency,
                timeout_s=self.gate.timeout_s,
            )
            await self.gate_runner.start()
        if not self.live_version:
            resources = await self.store.add_resources(self.resources("initial"))
            self.live_version = int(resources.version or 0)
            self.ledger.append("live", version=self.live_version, checkpoint=None, score=None)
        upstream = await asyncio.to_thread(self.policy.start, self.live_version, checkpoint)
        self.gateway.set_upstreams([upstream])
        self.gateway.set_policy(version=self.live_version)
        await self.sessions.start()
        self.feedback_count["client"] = len(self.sessions.feedback_uses)  # the run's, from the store
        self._serving = True
        loop = asyncio.get_running_loop()
        if self.judge_options is not None:
            self.judge = JudgeSweep(self.judge_options, self.store, grouping=self.updates.grouping)
            self._tasks.append(loop.create_task(self._judge_loop(), name="agentbolt-judge"))
        if self.policy.trains:
            self.trainer = OnlineTrainer(self)
            self._tasks.append(loop.create_task(self.trainer.run(), name="agentbolt-online-trainer"))
            if self.gate_runner is not None and self.live_score is None:
                self._baseline = loop.create_task(self._evaluate_live())
        self._tasks.append(loop.create_task(self._metrics_loop(), name="agentbolt-online-metrics"))
        log.info("agentbolt serve on %s/v1 (run %s, live version %d)", self.gateway.url, self.run_id, self.live_version)
        return self.url

    async def stop(self) -> None:
        """Stop serving; sessions stay open in the store and resume at the next start."""
        self._serving = False
        for task in self._tasks:
            task.cancel()
        for task in [*self._tasks, *([self._baseline] if self._baseline else [])]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self.sessions is not None:
            await self.sessions.stop()
        if self.gateway is not None:
            await self.gateway.stop()
        if self.gate_runner is not None:
            await self.gate_runner.stop()
        await asyncio.to_thread(self.policy.stop)
        if self.store is not None:
            with contextlib.suppress(Exception):
                await self._write_metrics()
            if self._own_store:
                await self.store.close()

    async def __aenter__(self) -> OnlineServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def readiness(self) -> str | None:
        """``None`` once the live policy serves and sessions are loaded (``GET /ready`` answers
        200), else why not yet (503)."""
        if self._serving and self.gateway is not None and self.gateway.upstreams:
            return None
        return f"the policy (version {self.live_version or 'initial'}) is starting"

    @property
    def url(self) -> str:
        """The OpenAI base URL live clients use: ``http://host:port/v1``."""
        return f"{self.gateway.url}/v1"

    # -- state --------------------------------------------------------------------------------------

    async def _replay(self) -> Path | None:
        checkpoint: Path | None = None
        for event in self.ledger.replay():
            kind = event.get("event")
            if kind == "start":
                self.run_id = str(event["run_id"])
            elif kind == "live":
                self.live_version = int(event["version"])
                checkpoint = Path(event["checkpoint"]) if event.get("checkpoint") else None
                self.live_score = score_from_record(event["score"]) if event.get("score") else None
            elif kind == "baseline" and int(event["version"]) == self.live_version:
                self.live_score = score_from_record(event["score"])
            elif kind == "consumed":
                self.trained.update(event.get("sessions") or [])
                self.trained_in.update(dict.fromkeys(event.get("sessions") or [], event.get("version")))
            elif kind == "gate":
                self.decisions.append(event["decision"])
        if not self.run_id:
            self.run_id = t.new_id("serve-")
            spec = RunSpec(
                run_id=self.run_id,
                name=self.run_name or "agentbolt serve",
                algorithm="serve",
                model=self.policy.model or None,
                config=self._run_config(),
            )
            await self.store.start_run(spec)
            self.ledger.append("start", run_id=self.run_id)
        else:
            run = await self.store.get_run(self.run_id)
            self._metrics_step = run.steps
        return checkpoint

    def _run_config(self) -> dict[str, Any]:
        """The serve run's recorded settings (what the dashboard's serving page reads: whether it
        trains, the gate's and the judge's settings, how often metrics are written)."""
        gate = self.gate
        judge = self.judge_options
        return {
            "updates": self.updates.model_dump(mode="json", exclude={"lightningrl"}),
            "trains": self.policy.trains,
            "sessions": self.session_options.model_dump(mode="json"),
            "gate": None
            if gate is None
            else gate.model_dump(mode="json", include={"samples", "z", "tolerance", "max_failed"})
            | {"tasks": len(gate.tasks)},
            "judge": None if judge is None else judge.model_dump(mode="json", include={"mode", "after_s", "max_tries"}),
            "metrics_every_s": self.metrics_every_s,
        }

    def resources(self, role: str) -> t.Resources:
        """The resources snapshot of a version: the endpoint its evaluation rollouts call."""
        base = self.gate_runner.url if self.gate_runner is not None else self.url
        return t.Resources(
            llm=t.LLMEndpoint(base_url=base, model=self.policy.model or "agentbolt"),
            extra={"agentbolt.online": {"role": role, "run_id": self.run_id}},
        )

    async def baseline(self) -> GateScore:
        """The live version's held-out score (evaluated once per live version)."""
        if self.live_score is not None and self.live_score.version == self.live_version:
            return self.live_score
        if self._baseline is None or (self._baseline.done() and self._baseline.exception() is not None):
            self._baseline = asyncio.get_running_loop().create_task(self._evaluate_live())
        return await self._baseline

    async def _evaluate_live(self) -> GateScore:
        assert self.gate_runner is not None
        version = self.live_version
        self.gate_runner.use(self.gateway.upstreams[0], version)
        score = await self.gate_runner.evaluate(version, tag="-live")
        self.live_score = score
        self.ledger.append("baseline", version=version, score=score.as_dict())
        await self.log_metrics({"gate/live_mean": score.mean, "gate/live_se": score.se})
        return score

    def record_decision(self, decision: GateDecision) -> None:
        record = decision.as_dict()
        self.decisions.append(record)
        self.ledger.append("gate", decision=record)

    # -- feedback -----------------------------------------------------------------------------------

    async def record_feedback(self, feedback: Feedback, *, source: str = "client") -> FeedbackResult:
        """Record one feedback (what ``POST /v1/feedback`` does)."""
        bounds = self.updates.lightningrl.reward_bounds
        result = await record_feedback(
            self.store, self.sessions, feedback, source=source, trained_in=self.trained_in, bounds=bounds
        )
        if result.status != "duplicate":
            self.feedback_count["client"] += 1
            for rollout_id in result.rollout_ids:
                session = self.sessions.by_rollout.get(rollout_id)
                if session is not None:
                    session.rewards += 1
                    if feedback.is_final:  # a client's final reward outranks a judge's score
                        session.has_final = True
                        session.judged = session.judged and source == "judge"
        else:
            self.feedback_count["duplicate"] += 1
        return result

    # -- background loops ---------------------------------------------------------------------------

    async def _judge_loop(self) -> None:
        assert self.judge is not None and self.judge_options is not None
        while True:
            await asyncio.sleep(self.judge_options.every_s)
            try:
                if self.judge.pending(list(self.sessions.by_rollout.values()), self.trained):
                    await self.gateway.flush()
                    await self.judge.sweep(list(self.sessions.by_rollout.values()), self.trained)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("judge sweep failed; retrying")

    async def _metrics_loop(self) -> None:
        while True:
            await asyncio.sleep(self.metrics_every_s)
            try:
                await self._write_metrics()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("could not record the serve metrics: %s", exc)

    async def _write_metrics(self) -> None:
        await self.log_metrics(self.metrics())

    async def log_metrics(self, values: Mapping[str, float]) -> None:
        """Record finite metrics under the serve run (the next step)."""
        clean = {
            k: float(v) for k, v in values.items() if isinstance(v, int | float) and v == v and abs(v) != float("inf")
        }
        if not clean:
            return
        self._metrics_step += 1
        await self.store.add_run_metrics(self.run_id, self._metrics_step, clean)

    def metrics(self) -> dict[str, float]:
        """The ``online/*`` counters (what the dashboard plots)."""
        sessions = list(self.sessions.by_rollout.values())
        closed = [s for s in sessions if s.closed]
        rated = [s for s in closed if s.has_final and not s.judged]
        judged = [s for s in closed if s.judged]
        values = {
            "online/sessions_open": float(len(sessions) - len(closed)),
            "online/sessions_closed": float(len(closed)),
            "online/sessions_trained": float(len(self.trained)),
            "online/calls": float(sum(s.calls for s in sessions)),
            "online/feedback": float(self.feedback_count["client"]),
            "online/feedback_rate": len(rated) / len(closed) if closed else 0.0,
            "online/judged": float(len(judged)),
            "online/held_out_overlap": float(len(self.trainer.held_out_overlap)) if self.trainer else 0.0,
            "serve/live_version": float(self.live_version),
        }
        if self.judge is not None:
            usage = self.judge.judge.usage
            if self.judge.scores:
                values["online/judge_mean"] = sum(self.judge.scores) / len(self.judge.scores)
            values |= {
                "judge/calls": float(usage.calls),
                "judge/malformed": float(usage.malformed),
                "judge/failed": float(usage.failed),
                "judge/superseded": float(self.judge.superseded),
                "judge/prompt_tokens": float(usage.prompt_tokens),
                "judge/completion_tokens": float(usage.completion_tokens),
            }
        return values

    def status(self) -> dict[str, Any]:
        """What ``GET /v1/online/status`` answers."""
        return {
            "run_id": self.run_id,
            "live_version": self.live_version,
            "live_score": self.live_score.as_dict() if self.live_score else None,
            "training": bool(self.trainer and self.trainer.busy),
            "ready_sessions": len(self.trainer.ready()) if self.trainer else 0,
            "metrics": self.metrics(),
            "sessions": dict(self.sessions.counters),
            "feedback": dict(self.feedback_count),
            "judge": self.judge.judge.usage.as_dict() if self.judge else None,
            "decisions": self.decisions[-10:],
            "swaps": self.swaps[-10:],
            "gateway": self.gateway.stats(),
        }


def serve(server: OnlineServer) -> None:
    """Run ``server`` until SIGINT/SIGTERM, then stop it cleanly (the process's entry point:
    ``agentbolt serve``; it sets the process's garbage collector, see :mod:`agentbolt.long_running_gc`)."""
    from ..long_running_gc import freeze_startup_objects

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await server.start()
        freeze_startup_objects()  # full collections then skip what the imports and start-up made
        started = time.monotonic()
        try:
            await stop.wait()
        finally:
            log.info("agentbolt serve stopping after %.0f s", time.monotonic() - started)
            await server.stop()

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:  # pragma: no cover
        asyncio.run(main())
