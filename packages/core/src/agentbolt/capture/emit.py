"""Emitters: record rewards, observations and other events as spans of the current rollout.

    from agentbolt.capture.emit import emit_reward, operation

    @operation
    def check_answer(text: str, gold: int) -> bool: ...

    emit_reward(1.0)                                   # a scalar reward
    emit_reward({"correct": 1.0, "format": 0.5}, primary="correct")
    emit_reward(-0.2, target_response_id=resp.id)     # credit one specific LLM call

Each emitter returns the span it made. The rollout comes from the context the runner set (see
:mod:`agentbolt.capture.tracing`), so concurrent rollouts never mix. Outside a rollout (say, a unit
test calling the agent directly) nothing is recorded and a :class:`NoRolloutWarning` says so.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar, overload

import orjson

from .. import semconv
from .. import types as t
from ..errors import UserError
from ..reward_validation import reward_number
from .tracing import current_rollout

__all__ = [
    "NoRolloutWarning",
    "emit_exception",
    "emit_message",
    "emit_object",
    "emit_observation",
    "emit_reward",
    "operation",
]

P = ParamSpec("P")
R = TypeVar("R")

_MAX_JSON = 64 * 1024


class NoRolloutWarning(UserWarning):
    """An emitter was called outside any rollout; the span was not recorded."""


def _to_json(value: Any) -> str:
    text = orjson.dumps(value, default=repr, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS).decode()
    return text if len(text) <= _MAX_JSON else text[:_MAX_JSON] + "...(truncated)"


def _parent() -> tuple[str | None, str | None]:
    """Trace id and span id of the current OpenTelemetry span, if any."""
    try:
        from opentelemetry import trace  # OpenTelemetry loads on the first emit, not when agents import us
    except ImportError:  # pragma: no cover - opentelemetry-api is a dependency
        return None, None
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None, None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


def _emit(
    name: str,
    kind: str,
    attributes: Mapping[str, Any],
    extra: Mapping[str, Any] | None,
    status: t.SpanStatus | None = None,
) -> t.Span:
    trace_id, parent = _parent()
    ctx = current_rollout()
    span = t.Span.create(
        name,
        trace_id=trace_id,
        parent_span_id=parent,
        status=status,
        attributes={semconv.SPAN_KIND_ATTR: kind, **attributes, **(extra or {})},
        # made with the rollout's ids, so recording it needs no copy
        rollout_id=None if ctx is None else ctx.rollout_id,
        attempt_id=None if ctx is None else ctx.attempt_id,
    )
    if ctx is None:
        warnings.warn(
            f"{name} emitted outside a rollout: not recorded (agentbolt runners set the rollout for you)",
            NoRolloutWarning,
            stacklevel=3,
        )
        return span
    ctx.record(span)
    return span


def _reward_value(value: Any, what: str) -> float:
    return reward_number(value, what)  # RewardRefused (a UserError) names what is wrong


def emit_reward(
    reward: float | Mapping[str, float],
    *,
    primary: str | None = None,
    target_span_id: str | None = None,
    target_response_id: str | None = None,
    final: bool = False,
    attributes: Mapping[str, Any] | None = None,
) -> t.Span:
    """Record a reward.

    Args:
        reward: a number, or named dimensions ``{name: value}`` (then ``primary`` names the one
            training uses; a single-entry dict needs no ``primary``). Each value is a finite
            ``int`` or ``float`` of magnitude at most ``1e15``: a ``bool`` (``float(ok)`` says
            what you mean), a string, a list or an object raises
            :class:`~agentbolt.reward_validation.RewardRefused` (a ``UserError``), and nothing is
            recorded. The run's ``reward_range`` is applied when training reads the reward.
        target_span_id / target_response_id: credit a specific LLM call (its span id, from the
            gateway's ``X-Agentbolt-Span-Id`` response header, or the ``id`` of its response);
            otherwise the reward belongs to the LLM call that precedes it.
        final: this is the episode's final reward (what the agent would return).
    """
    if isinstance(reward, Mapping):
        if not reward:
            raise UserError("emit_reward got an empty dict; give at least one {name: value}")
        dims = {str(k): _reward_value(v, f"reward {k!r}") for k, v in reward.items()}
        if primary is None:
            if len(dims) > 1:
                raise UserError(
                    f"emit_reward got {len(dims)} dimensions; say which trains with primary= (one of {sorted(dims)})"
                )
            primary = next(iter(dims))
        if primary not in dims:
            raise UserError(f"primary={primary!r} is not one of the reward dimensions {sorted(dims)}")
        value = dims[primary]
    else:
        value = _reward_value(reward, "reward")
        dims = {primary or "reward": value}
        primary = primary or "reward"
    attrs: dict[str, Any] = {
        semconv.REWARD_VALUE: value,
        semconv.REWARD_PRIMARY: primary,
        semconv.REWARD_DIMENSIONS: orjson.dumps(dims).decode(),
        semconv.REWARD_IS_FINAL: final,
    }
    if target_span_id:
        attrs[semconv.REWARD_TARGET_SPAN_ID] = target_span_id
    if target_response_id:
        attrs[semconv.REWARD_TARGET_RESPONSE_ID] = target_response_id
    span = _emit(semconv.SPAN_REWARD, semconv.KIND_REWARD, attrs, attributes)
    ctx = current_rollout()
    if ctx is not None:
        ctx.rewards.append((value, final))
    return span


def emit_observation(observation: Any, *, attributes: Mapping[str, Any] | None = None) -> t.Span:
    """Record what the environment returned to the agent (a tool result, a database row, ...)."""
    return _emit(
        semconv.SPAN_OBSERVATION,
        semconv.KIND_OBSERVATION,
        {semconv.OBSERVATION_BODY: _to_json(observation)},
        attributes,
    )


def emit_message(message: str, *, attributes: Mapping[str, Any] | None = None) -> t.Span:
    """Record a free-form message (a note, a decision, a log line worth keeping with the trace)."""
    return _emit(semconv.SPAN_MESSAGE, semconv.KIND_MESSAGE, {semconv.MESSAGE_BODY: str(message)}, attributes)


def emit_object(obj: Any, *, attributes: Mapping[str, Any] | None = None) -> t.Span:
    """Record any JSON-serialisable object (non-JSON values are stored as their ``repr``)."""
    attrs = {semconv.OBJECT_JSON: _to_json(obj), semconv.OBJECT_TYPE: type(obj).__qualname__}
    return _emit(semconv.SPAN_OBJECT, semconv.KIND_OBJECT, attrs, attributes)


def emit_exception(exc: BaseException, *, attributes: Mapping[str, Any] | None = None) -> t.Span:
    """Record an exception (type, message, traceback); the span's status is ERROR."""
    info = t.ErrorInfo.from_exception(exc)
    return _emit(
        semconv.SPAN_EXCEPTION,
        semconv.KIND_EXCEPTION,
        {
            semconv.EXCEPTION_TYPE: info.type,
            semconv.EXCEPTION_MESSAGE: info.message,
            semconv.EXCEPTION_STACKTRACE: info.traceback or "",
        },
        attributes,
        t.SpanStatus(code=t.StatusCode.ERROR, message=info.message),
    )


# ------------------------------------------------------------------------------------------------
# operation: a span around a block or a function, with its inputs and output
# ------------------------------------------------------------------------------------------------


@contextmanager
def _operation_span(name: str, inputs: Mapping[str, Any] | None) -> Iterator[Any]:
    from opentelemetry import trace  # loaded on first use, like in _parent()

    tracer = trace.get_tracer("agentbolt")
    with tracer.start_as_current_span(
        semconv.SPAN_OPERATION, record_exception=True, set_status_on_exception=True
    ) as span:
        span.set_attribute(semconv.SPAN_KIND_ATTR, semconv.KIND_OPERATION)
        span.set_attribute(semconv.OPERATION_NAME, name)
        if inputs is not None:
            span.set_attribute(semconv.OPERATION_INPUT, _to_json(dict(inputs)))
        yield span


class _Operation:
    """What ``operation("name")`` returns: a context manager, and a decorator using that name.

    As a context manager, ``.set_output(value)`` records the block's result.
    """

    def __init__(self, name: str | None) -> None:
        self.name = name
        self._cm: Any = None
        self._span: Any = None

    def __enter__(self) -> _Operation:
        self._cm = _operation_span(self.name or "operation", None)
        self._span = self._cm.__enter__()
        return self

    def __exit__(self, *exc: Any) -> bool | None:
        return self._cm.__exit__(*exc)

    def set_output(self, value: Any) -> None:
        self._span.set_attribute(semconv.OPERATION_OUTPUT, _to_json(value))

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        return _decorate(fn, self.name or fn.__qualname__)


@overload
def operation(fn: Callable[P, R]) -> Callable[P, R]: ...
@overload
def operation(fn: str | None = None, *, name: str | None = None) -> _Operation: ...


def operation(fn: Any = None, *, name: str | None = None) -> Any:
    """A span around a function call (with its arguments and result) or a ``with`` block.

        @operation
        def search(query: str) -> list[str]: ...

        @operation("fetch-rows")           # or operation(name="fetch-rows")
        async def fetch(key: str) -> dict: ...

        with operation("grade") as op:
            op.set_output(score)

    Exceptions mark the span as an error and propagate. Spans made inside (LLM calls through
    instrumented clients, other operations, emitted rewards) nest under it.
    """
    if callable(fn):
        return _decorate(fn, name or fn.__qualname__)
    return _Operation(fn if isinstance(fn, str) else name)


def _decorate(fn: Callable[P, R], op_name: str) -> Callable[P, R]:
    signature = inspect.signature(fn)

    def bound(args: Any, kwargs: Any) -> dict[str, Any]:
        try:
            return dict(signature.bind(*args, **kwargs).arguments)
        except TypeError:
            return {"args": args, "kwargs": kwargs}

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            with _operation_span(op_name, bound(args, kwargs)) as span:
                result = await fn(*args, **kwargs)
                span.set_attribute(semconv.OPERATION_OUTPUT, _to_json(result))
                return result

        return async_wrapper  # type: ignore[return-value]  # R is fn's coroutine type, which mypy cannot tie to the wrapper's

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _operation_span(op_name, bound(args, kwargs)) as span:
            result = fn(*args, **kwargs)
            span.set_attribute(semconv.OPERATION_OUTPUT, _to_json(result))
            return result

    return wrapper
