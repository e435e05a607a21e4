"""Rules every backend applies to runs and rollout searches (one place, like :mod:`.lifecycle`)."""

from __future__ import annotations

import orjson

from .. import types as t
from ..errors import InvalidTransitionError, UserError
from .lifecycle import check_limit
from .run_records import RolloutSearch, Run, RunSpec, RunStatus

__all__ = [
    "check_after_seq",
    "check_list_limit",
    "check_step",
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


def check_list_limit(limit: int) -> None:
    """Validate ``list_runs(limit=...)``: an integer from 1 to :data:`~agentbolt.store.wire.MAX_LIMIT`."""

    check_limit(limit)


def check_step(step: int) -> None:
    """Validate a metrics ``step``: a 64-bit integer."""
    if isinstance(step, bool) or not isinstance(step, int) or not t.INT64_MIN <= step <= t.INT64_MAX:
        raise UserError(f"step must be a 64-bit integer, got {step!r}")


def check_after_seq(after_seq: int | None) -> None:
    """Validate ``get_run_metrics(after_seq=...)``: ``None`` or a 64-bit integer."""
    if after_seq is not None and (
        isinstance(after_seq, bool) or not isinstance(after_seq, int) or not t.INT64_MIN <= after_seq <= t.INT64_MAX
    ):
        raise UserError(f"after_seq must be a 64-bit integer, got {after_seq!r}")


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
