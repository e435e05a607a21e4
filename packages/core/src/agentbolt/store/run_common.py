"""Rules every backend applies to runs and rollout searches (one place, like :mod:`.lifecycle`)."""

from __future__ import annotations

import orjson

from .. import types as t
from ..errors import InvalidTransitionError, UserError
from .run_records import RolloutSearch, Run, RunSpec, RunStatus

__all__ = [
    "error_kind_prefix",
    "finished_run",
    "matches_search",
    "new_run",
]


def new_run(spec: RunSpec, now: float) -> Run:
    """The running run for a spec."""
    return Run(
        run_id=spec.run_id or t.new_id("run-"),
        name=spec.name,
        algorithm=spec.algorithm,
        model=spec.model,
        config=spec.config,
        status=RunStatus.RUNNING,
        started_at=now,
    )


def finished_run(run: Run, status: RunStatus | str, error: str | None, now: float) -> Run:
    """``run`` with its final status; only a running run can finish."""
    try:
        status = RunStatus(status)
    except ValueError:
        raise UserError(f"invalid run status {status!r}; valid: {', '.join(s.value for s in RunStatus)}") from None
    if not status.is_final:
        raise UserError("finish_run needs a final status (succeeded, failed or cancelled)")
    if run.status.is_final:
        raise InvalidTransitionError(f"run {run.run_id} already ended ({run.status.value})")
    return run.model_copy(update={"status": status, "error": error, "ended_at": now})


def error_kind_prefix(kind: t.ErrorKind) -> str:
    """The start of a stored ``ErrorInfo`` JSON of this kind (``kind`` is its first field), for
    SQL ``LIKE`` filters."""
    return f'{{"kind":"{t.ErrorKind(kind).value}"'


def matches_search(query: RolloutSearch, r: t.Rollout) -> bool:
    """True when rollout ``r`` passes every filter of ``query`` (the SQL backend's semantics)."""
    if query.run_id is not None and r.run_id != query.run_id:
        return False
    if query.step is not None and r.step != query.step:
        return False
    if query.status is not None and r.status not in query.status:
        return False
    if query.mode is not None and r.mode != query.mode:
        return False
    if query.reward_min is not None and (r.final_reward is None or r.final_reward < query.reward_min):
        return False
    if query.reward_max is not None and (r.final_reward is None or r.final_reward > query.reward_max):
        return False
    if query.failure_kind is not None and (r.error is None or r.error.kind != query.failure_kind):
        return False
    if query.text is not None:
        needle = query.text.lower()
        if needle not in (r.task_id or "").lower() and needle not in orjson.dumps(r.input).decode().lower():
            return False
    return True
