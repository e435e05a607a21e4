"""The rollout/attempt state machine, shared by every store backend.

Backends read the current records, call these pure functions, and write what they return in
one transaction. Keeping the rules here means the memory, SQL and any third-party backend
agree on every transition.

Rules:

- ``queued -> running`` on claim; the attempt gets a lease (renewed by heartbeats) and, when the
  rollout has ``timeout_s``, a deadline.
- Expiry is decided by time, not by when a sweep runs: an attempt past its deadline is
  ``timed_out`` (the rollout fails with ``ErrorKind.TIMEOUT``); past its lease it is ``lost``
  (the rollout is requeued while attempts remain, else fails with ``ErrorKind.LOST``).
- A finish report for an attempt that is no longer running is rejected
  (:class:`~agentbolt.errors.StaleAttemptError`), never applied.
- A failure of kind ``infrastructure`` or ``lost`` requeues the rollout while attempts remain;
  any other failure (an agent exception, a timeout) fails the rollout.
- Final rollouts never change again; cancelling one that succeeded or failed is an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .. import types as t
from ..errors import ConflictError, InvalidTransitionError, StaleAttemptError, UserError
from ..fields import finite_number
from .wire import MAX_LEASE_S, MAX_LIMIT

__all__ = [
    "MAX_LEASE_S",
    "MAX_LIMIT",
    "RETRYABLE",
    "cancel",
    "check_lease",
    "check_limit",
    "check_purge_args",
    "check_reward",
    "claim",
    "ended_as_reported",
    "expire",
    "expire_due",
    "finish",
    "new_rollout",
    "plan_enqueue",
    "renew",
]

RETRYABLE = frozenset({t.ErrorKind.INFRASTRUCTURE, t.ErrorKind.LOST})
"""Failure kinds that requeue a rollout while attempts remain."""
_STORE_ENDED = frozenset({t.ErrorKind.CANCELLED, t.ErrorKind.TIMEOUT, t.ErrorKind.LOST})
"""Error kinds the store itself gives attempts (a worker's own failure report has another)."""


def new_rollout(spec: t.RolloutSpec, rollout_id: str, now: float) -> t.Rollout:
    """The queued rollout for a spec."""
    return t.Rollout(
        rollout_id=rollout_id,
        task_id=spec.task_id,
        input=spec.input,
        mode=spec.mode,
        group_id=spec.group_id,
        resources_version=spec.resources_version,
        status=t.RolloutStatus.QUEUED,
        max_attempts=spec.max_attempts,
        timeout_s=spec.timeout_s,
        created_at=now,
        updated_at=now,
        metadata=spec.metadata,
        run_id=spec.run_id,
        step=spec.step,
    )


def plan_enqueue(
    ids: Sequence[str], specs: Sequence[t.RolloutSpec], stored: Mapping[str, t.Rollout], now: float
) -> tuple[list[t.Rollout], dict[str, t.Rollout]]:
    """What ``enqueue`` returns (one rollout per spec, in order) and the new rollouts to write (by
    id). A spec whose id is ``stored``, or earlier in the batch, with the same content gives that
    rollout; with other content it is a :class:`~agentbolt.errors.ConflictError`."""
    planned: dict[str, t.Rollout] = {}
    out: list[t.Rollout] = []
    for rid, spec in zip(ids, specs, strict=True):
        have = stored.get(rid) or planned.get(rid)
        if have is None:
            have = planned[rid] = new_rollout(spec, rid, now)
        elif not have.matches_spec(spec):
            raise ConflictError(f"rollout {rid} already exists with different content; use a new rollout_id")
        out.append(have)
    return out, planned


def check_limit(limit: int) -> None:
    """``limit`` of a claim or a page: an integer from 1 to :data:`MAX_LIMIT`."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise UserError(f"limit must be an integer from 1 to {MAX_LIMIT}, got {limit!r}")


def check_lease(lease_s: float) -> None:
    """A lease length: positive, finite, at most :data:`MAX_LEASE_S`."""
    value = finite_number(lease_s, "lease_s")
    if not 0 < value <= MAX_LEASE_S:
        raise UserError(f"lease_s must be positive and at most {MAX_LEASE_S:g} s (a week), got {lease_s}")


def check_reward(reward: float | None) -> None:
    """A reported reward: ``None`` or a finite number."""
    if reward is not None:
        finite_number(reward, "reward")


def check_purge_args(rollout_ids: object, older_than_s: float | None) -> None:
    """``purge`` arguments: something to purge, and a non-negative finite age."""
    if rollout_ids is None and older_than_s is None:
        raise UserError("purge needs rollout_ids or older_than_s")
    if older_than_s is not None and finite_number(older_than_s, "older_than_s") < 0:
        raise UserError(f"older_than_s must be 0 or more (an age in seconds), got {older_than_s}")


def check_claim_args(limit: int, lease_s: float) -> None:
    """Validate ``dequeue`` arguments (every backend, before touching anything)."""
    check_limit(limit)
    check_lease(lease_s)


def claim(
    rollout: t.Rollout,
    *,
    attempt_id: str,
    worker_id: str,
    lease_s: float,
    now: float,
    resources_version: int | None,
) -> tuple[t.Rollout, t.Attempt]:
    """A worker claims a queued rollout: it becomes running under a new attempt."""
    if rollout.status is not t.RolloutStatus.QUEUED:
        raise InvalidTransitionError(
            f"rollout {rollout.rollout_id} is {rollout.status.value}; only queued rollouts can be claimed"
        )
    if lease_s <= 0:
        raise UserError(f"lease_s must be positive, got {lease_s}")
    attempt = t.Attempt(
        attempt_id=attempt_id,
        rollout_id=rollout.rollout_id,
        index=rollout.attempt_count + 1,
        worker_id=worker_id,
        status=t.AttemptStatus.RUNNING,
        lease_expires_at=now + lease_s,
        deadline_at=None if rollout.timeout_s is None else now + rollout.timeout_s,
        started_at=now,
        heartbeat_at=now,
    )
    updated = rollout.model_copy(
        update={
            "status": t.RolloutStatus.RUNNING,
            "attempt_count": attempt.index,
            "current_attempt_id": attempt_id,
            "started_at": rollout.started_at if rollout.started_at is not None else now,
            "resources_version": rollout.resources_version
            if rollout.resources_version is not None
            else resources_version,
            "updated_at": now,
        }
    )
    return updated, attempt


def expire_due(attempt: t.Attempt, now: float) -> bool:
    """True when a running attempt's deadline or lease has passed."""
    return attempt.status is t.AttemptStatus.RUNNING and (
        (attempt.deadline_at is not None and now >= attempt.deadline_at)
        or (attempt.lease_expires_at is not None and now >= attempt.lease_expires_at)
    )


def expire(rollout: t.Rollout, attempt: t.Attempt, now: float) -> tuple[t.Rollout, t.Attempt] | None:
    """Apply a passed deadline or lease to a running attempt; ``None`` when nothing is due.

    A passed deadline wins over a passed lease.
    """
    if attempt.status is not t.AttemptStatus.RUNNING:
        return None
    if attempt.deadline_at is not None and now >= attempt.deadline_at:
        status, kind, reason = t.AttemptStatus.TIMED_OUT, t.ErrorKind.TIMEOUT, "timeout"
        message = f"attempt {attempt.index} ran past the rollout's timeout of {rollout.timeout_s} s"
    elif attempt.lease_expires_at is not None and now >= attempt.lease_expires_at:
        status, kind, reason = t.AttemptStatus.LOST, t.ErrorKind.LOST, "lease_expired"
        message = f"worker {attempt.worker_id} stopped renewing its lease on attempt {attempt.index}"
    else:
        return None
    error = t.ErrorInfo(kind=kind, type=reason, message=message)
    return _end(rollout, attempt, status, error, now, reward=None)


def renew(attempt: t.Attempt, lease_s: float, now: float) -> t.Attempt:
    """Extend a running attempt's lease (a heartbeat). Call :func:`expire` first."""
    check_lease(lease_s)
    if attempt.status is not t.AttemptStatus.RUNNING:
        return attempt
    return attempt.model_copy(update={"lease_expires_at": now + lease_s, "heartbeat_at": now})


def finish(
    rollout: t.Rollout,
    attempt: t.Attempt,
    status: t.AttemptStatus,
    *,
    now: float,
    reward: float | None = None,
    error: t.ErrorInfo | None = None,
) -> tuple[t.Rollout, t.Attempt]:
    """A worker reports the end of its attempt. Call :func:`expire` first.

    Raises:
        StaleAttemptError: the attempt is no longer running (lost, timed out, cancelled, or
            already reported) or is not the rollout's current attempt.
        UserError: ``status`` is not ``succeeded`` or ``failed``.
    """
    if status not in (t.AttemptStatus.SUCCEEDED, t.AttemptStatus.FAILED):
        raise UserError(f"a worker can report succeeded or failed, not {status.value!r}")
    check_reward(reward)
    if attempt.status is not t.AttemptStatus.RUNNING or rollout.current_attempt_id != attempt.attempt_id:
        why = attempt.error.message if attempt.error else f"it is {attempt.status.value}"
        raise StaleAttemptError(
            f"report for attempt {attempt.attempt_id} of rollout {rollout.rollout_id} rejected: {why}. "
            "Stop this attempt's agent; the store has moved on."
        )
    if status is t.AttemptStatus.FAILED and error is None:
        error = t.ErrorInfo(kind=t.ErrorKind.AGENT, type="failed", message="the worker reported a failure")
    if status is t.AttemptStatus.SUCCEEDED:
        error = None
    return _end(rollout, attempt, status, error, now, reward=reward)


def cancel(
    rollout: t.Rollout, attempt: t.Attempt | None, now: float, reason: str = "cancelled by caller"
) -> tuple[t.Rollout, t.Attempt | None]:
    """Cancel a rollout that has not finished; a running attempt fails with kind ``cancelled``.

    Cancelling an already cancelled rollout changes nothing.
    """
    if rollout.status is t.RolloutStatus.CANCELLED:
        return rollout, attempt
    if rollout.status.is_final:
        raise InvalidTransitionError(
            f"rollout {rollout.rollout_id} already {rollout.status.value}; a finished rollout cannot be cancelled"
        )
    error = t.ErrorInfo(kind=t.ErrorKind.CANCELLED, type="cancelled", message=reason)
    if attempt is not None and attempt.status is t.AttemptStatus.RUNNING:
        attempt = attempt.model_copy(
            update={"status": t.AttemptStatus.FAILED, "ended_at": now, "error": error, "lease_expires_at": None}
        )
    updated = rollout.model_copy(
        update={"status": t.RolloutStatus.CANCELLED, "error": error, "ended_at": now, "updated_at": now}
    )
    return updated, attempt


def _end(
    rollout: t.Rollout,
    attempt: t.Attempt,
    status: t.AttemptStatus,
    error: t.ErrorInfo | None,
    now: float,
    *,
    reward: float | None,
) -> tuple[t.Rollout, t.Attempt]:
    ended = attempt.model_copy(update={"status": status, "ended_at": now, "error": error})
    update: dict[str, Any]
    if status is t.AttemptStatus.SUCCEEDED:
        update = {"status": t.RolloutStatus.SUCCEEDED, "final_reward": reward, "error": None, "ended_at": now}
    elif error is not None and error.kind in RETRYABLE and rollout.attempt_count < rollout.max_attempts:
        update = {"status": t.RolloutStatus.QUEUED, "error": error, "final_reward": None}
    else:
        update = {"status": t.RolloutStatus.FAILED, "error": error, "ended_at": now, "final_reward": reward}
    return rollout.model_copy(update={**update, "updated_at": now}), ended


def ended_as_reported(attempt: t.Attempt, status: t.AttemptStatus, error: t.ErrorInfo | None) -> bool:
    """Whether an ended attempt is exactly what a worker's report (``status``, ``error``) would
    have made of it: a client that lost the answer to a report it repeated tells this way whether
    the lost try had applied."""
    if attempt.status is not status:
        return False
    if status is t.AttemptStatus.SUCCEEDED:
        return True  # only the worker's report makes an attempt succeed
    if error is not None:
        return attempt.error == error
    return attempt.error is not None and attempt.error.kind not in _STORE_ENDED
