"""Background training: rewarded sessions -> LightningRL rows -> a candidate -> the gate -> live.

One update (:meth:`OnlineTrainer.step`), when at least ``min_sessions`` closed, rewarded,
untrained sessions wait:

1. take the oldest (up to ``max_sessions``), leaving out any whose first message is a held-out
   task's; regroup them (:mod:`agentbolt.online.grouping`) and run LightningRL on their spans
   exactly as for a training run (``process(..., policy_version=live)``); sessions whose values
   would stop the step are quarantined with their reason (ledger ``quarantined``, metrics
   ``lightningrl/quarantined/*``) and the others train;
2. record in the ledger that these sessions are consumed, then update the training copy
   (``policy.train(rows)``, on a worker thread: live traffic keeps flowing);
3. publish a resources version for the candidate and load it into the standby slot;
4. with a gate: run the held-out tasks against the candidate and decide against the live
   version's score; without one, the candidate passes;
5. passed: save its weights, point the gateway at the standby slot (new calls go there at once),
   wait for the former live slot to drain (``drain_timeout_s``), record it live in the ledger;
   rejected: the training copy goes back to the live weights, the ledger and the run's metrics
   say why, the live version stays.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from typing import TYPE_CHECKING, Any

from .. import types as t
from ..lightningrl import BatchReport, LightningRL, LightningRLBatch, Quarantined
from . import keys
from .gate import GateDecision, decide
from .grouping import group_ids

if TYPE_CHECKING:
    from .serve import OnlineServer
    from .sessions import Session

__all__ = ["OnlineTrainer"]

log = logging.getLogger(__name__)


class OnlineTrainer:
    """Runs updates for an :class:`~agentbolt.online.serve.OnlineServer` (see the module docstring)."""

    def __init__(self, server: OnlineServer) -> None:
        self.server = server
        self.options = server.updates
        self.lightningrl = LightningRL(self.options.lightningrl)
        self.updates = 0
        self.held_out_overlap: set[str] = set()
        """Rollout ids of the sessions left out because they asked a held-out task."""
        self.busy = False

    def ready(self) -> list[Session]:
        """Closed, rewarded, untrained sessions (oldest first), held-out overlaps left out."""
        server = self.server
        out = []
        for s in server.sessions.by_rollout.values():
            if not s.closed or not s.has_final or s.rollout_id in server.trained:
                continue
            if server.held_out_keys and self._overlaps(s):
                self.held_out_overlap.add(s.rollout_id)
                continue
            out.append(s)
        out.sort(key=lambda s: s.ended_at or 0.0)
        return out

    def _overlaps(self, session: Session) -> bool:
        """Whether a session asked a held-out task: its question's or its task key's normalized text
        is a held-out task's."""
        held = self.server.held_out_keys
        if session.prompt_key is not None and session.prompt_key in held:
            return True
        return session.task_key is not None and keys.prompt_key(session.task_key) in held

    async def run(self) -> None:
        """Check for enough sessions every ``check_every_s``, forever."""
        while True:
            await asyncio.sleep(self.options.check_every_s)
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("online update failed; the live version is unchanged, retrying later")

    async def step(self, *, force: bool = False) -> GateDecision | None:
        """One update if enough sessions wait (``force``: however many, at least one)."""
        ready = self.ready()
        if not ready or (len(ready) < self.options.min_sessions and not force):
            return None
        self.busy = True
        try:
            return await self._update(ready[: self.options.max_sessions])
        finally:
            self.busy = False

    async def _update(self, batch: list[Session]) -> GateDecision | None:
        server = self.server
        started = time.monotonic()
        await server.gateway.flush()
        ids = [s.rollout_id for s in batch]
        rollouts = await server.store.get_rollouts(ids)
        spans: dict[str, list[t.Span]] = {}
        for i in range(0, len(ids), 200):
            spans.update(await server.store.query_spans(ids[i : i + 200], latest_attempt_only=True))
        groups = group_ids(
            batch, self.options.grouping, prefix=f"u{self.updates + 1}", min_group=self.options.min_group
        )
        regrouped = [r.model_copy(update={"group_id": g}) for r, g in zip(rollouts, groups, strict=True)]
        processed = self._process(regrouped, spans)
        rows = list(processed.rows)
        report = processed.report.metrics("lightningrl/")
        server.ledger.append("consumed", sessions=ids, rows=len(rows), version=server.live_version)
        if processed.report.quarantined:
            quarantined = [q.model_dump() for q in processed.report.quarantined]
            server.ledger.append("quarantined", sessions=quarantined)
            log.warning(
                "online update: %d sessions quarantined (the others train): %s",
                len(quarantined),
                "; ".join(f"{q['rollout_id']}: {q['reason']}" for q in quarantined[:5]),
            )
        server.trained.update(ids)
        server.trained_in.update(dict.fromkeys(ids, server.live_version))
        if not rows:
            log.warning("online update: %d sessions gave no trainable row\n%s", len(ids), processed.report.summary())
            await server.log_metrics({"train/sessions": float(len(ids)), "train/rows": 0.0, **report})
            return None
        self.updates += 1
        rewards = [r.final_reward for r in processed.episodes if r.final_reward is not None]
        train_metrics = dict(await asyncio.to_thread(server.policy.train, rows))
        resources = await server.store.add_resources(server.resources("candidate"))
        version = int(resources.version or 0)
        upstream = await asyncio.to_thread(server.policy.stage, version)
        trained_s = time.monotonic() - started
        server.ledger.append("candidate", version=version, sessions=len(ids), rows=len(rows), metrics=train_metrics)
        values = {
            "train/sessions": float(len(ids)),
            "train/rows": float(len(rows)),
            "train/reward": sum(rewards) / len(rewards) if rewards else 0.0,
            "train/seconds": trained_s,
            **{f"update/{k}": float(v) for k, v in train_metrics.items()},
            **report,
        }
        decision = await self._gate(version, upstream)
        if decision.passed:
            await self._go_live(version, upstream, decision)
        else:
            await asyncio.to_thread(server.policy.revert)
            log.warning("online: version %d stays out: %s", version, decision.reason)
        server.record_decision(decision)
        await server.log_metrics({**values, **decision.metrics(), "serve/live_version": float(server.live_version)})
        return decision

    def _process(self, rollouts: list[t.Rollout], spans: dict[str, list[t.Span]]) -> LightningRLBatch:
        """LightningRL on the update's sessions. LightningRL quarantines the sessions whose values
        would stop the step; should processing the batch raise all the same, each session is
        processed alone and the ones that raise are quarantined (reason ``error``), so one session
        never blocks the others' training (the same batch is never retried forever)."""
        version = self.server.live_version
        try:
            return self.lightningrl.process(rollouts, spans, policy_version=version)
        except Exception as exc:
            log.warning("online update: processing %d sessions raised %r; finding the culprit", len(rollouts), exc)
        good: list[t.Rollout] = []
        broken: list[Quarantined] = []
        for rollout in rollouts:
            try:
                self.lightningrl.process([rollout], spans, policy_version=version)
                good.append(rollout)
            except Exception as exc:
                detail = f"{type(exc).__name__}: {str(exc)[:200]}"
                broken.append(
                    Quarantined(
                        rollout_id=rollout.rollout_id,
                        group_id=rollout.group_id,
                        reason="error",
                        detail=detail,
                        stage="update",
                    )
                )
        try:
            collected = self.lightningrl.collect(good, spans, policy_version=version)
            return self.lightningrl.to_rows(
                collected.transitions,
                policy_version=version,
                report=collected.report,
                episodes=collected.episodes,
                quarantined=broken,
            )
        except Exception as exc:  # the group as a whole still fails: nothing of this update trains
            log.warning("online update: the remaining sessions still raise %r; quarantining the update", exc)
            detail = f"{type(exc).__name__}: {str(exc)[:200]}"
            broken += [
                Quarantined(rollout_id=r.rollout_id, group_id=r.group_id, reason="error", detail=detail, stage="update")
                for r in good
            ]
            report = BatchReport(rollouts=len(rollouts), quarantined=broken)
            return LightningRLBatch(transitions=[], report=report)

    async def _gate(self, version: int, upstream: Any) -> GateDecision:
        server = self.server
        if server.gate_runner is None:
            return GateDecision(version, True, "no gate configured: every candidate goes live")
        live = await server.baseline()
        server.gate_runner.use(upstream, version)
        candidate = await server.gate_runner.evaluate(version)
        assert server.gate is not None
        return decide(
            candidate, live, z=server.gate.z, tolerance=server.gate.tolerance, max_failed=server.gate.max_failed
        )

    async def _go_live(self, version: int, upstream: Any, decision: GateDecision) -> None:
        server = self.server
        checkpoint = server.state_dir / "versions" / f"v{version}"
        await asyncio.to_thread(server.policy.save, checkpoint)
        old = await asyncio.to_thread(server.policy.promote)
        swap_started = time.monotonic()
        server.gateway.set_upstreams([upstream])
        server.gateway.set_policy(version=version)
        previous = server.live_version
        server.live_version = version
        server.live_score = decision.candidate
        server.ledger.append(
            "live",
            version=version,
            checkpoint=str(checkpoint),
            score=decision.candidate.as_dict() if decision.candidate else None,
        )
        drained = await server.gateway.drain_upstream(old.base_url, self.options.drain_timeout_s)
        if not drained:
            log.warning(
                "the former live slot still has calls after %g s; waiting for them before reusing it",
                self.options.drain_timeout_s,
            )
        await asyncio.to_thread(server.policy.release, self.options.drain_timeout_s)
        server.swaps.append({"version": version, "previous": previous, "drain_s": time.monotonic() - swap_started})
        self._prune_checkpoints()
        log.info("online: version %d is live (was %d): %s", version, previous, decision.reason)

    def _prune_checkpoints(self) -> None:
        directory = self.server.state_dir / "versions"
        if not directory.exists():
            return
        versions = sorted(
            (p for p in directory.iterdir() if p.name.startswith("v") and p.name[1:].isdigit()),
            key=lambda p: int(p.name[1:]),
        )
        for path in versions[: -self.options.keep_versions]:
            shutil.rmtree(path, ignore_errors=True)
