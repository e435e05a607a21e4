"""Store operations, each declared once: a method of :class:`~agentbolt.store.Store` decorated
with :func:`operation`.

The declaration is the method's signature (names, types with their bounds, defaults), its
docstring (the ``Args:`` section documents each field) and its route. Everything else is derived
from it:

- the **Python method** every backend shares: it binds and validates the arguments against the
  declaration (a bad value is a :class:`~agentbolt.errors.UserError` naming the argument, before
  anything is touched), then hands them to the backend, which implements one coroutine per
  operation, ``_<name>(**arguments)``, receiving every argument as a keyword, defaults applied;
- the **wire format**: :attr:`Operation.request` (the request body or query), :attr:`Operation.response`
  (the answer, which wraps the result in the field named by ``returns``);
- the **HTTP client's methods** (:class:`~agentbolt.store.http.HttpStore` sends the request
  the declaration describes, retrying as its ``idempotent`` flag allows) and the **store server's
  routes** (:mod:`agentbolt.store.server.routes`), with their OpenAPI documentation.

So a new operation is its declaration plus its memory and SQL implementations. Importing this
module is cheap: models are built on first use.
"""

from __future__ import annotations

import functools
import inspect
import re
import typing
from collections.abc import Awaitable, Callable, Iterator
from functools import cached_property
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model

from ..errors import AgentboltError, UserError

__all__ = ["WIRE_CONFIG", "Operation", "operation", "operation_of", "operations"]

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

WIRE_CONFIG = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)
"""Request and response bodies: unknown fields are refused, numbers are finite."""

_PATH_PARAM = re.compile(r"{(\w+)(?::\w+)?}")


class Operation:
    """One store operation: what its declaration says, and the models derived from it.

    Built by :func:`operation`; read it as ``Store.dequeue.operation``.
    """

    def __init__(
        self,
        fn: Callable[..., Awaitable[Any]],
        route: str,
        *,
        tag: str,
        returns: str | None,
        idempotent: bool,
        body: str | None,
        waits: str | None,
        done: Callable[[Any], bool] | None,
        reports_done: bool,
        prepare: Callable[[Any], Any] | None,
        lost_answer: str | None,
        recover: Callable[[Any, Any], Awaitable[Any]] | None,
    ) -> None:
        method, _, path = route.partition(" ")
        if method not in ("GET", "POST") or not path.startswith("/"):
            raise ValueError(f"route must look like 'POST /v1/...', got {route!r}")
        self.name: str = fn.__name__
        """The method's name; also the OpenAPI operation id."""
        self.method: Literal["GET", "POST"] = "GET" if method == "GET" else "POST"
        """HTTP method: ``GET`` sends the arguments as query parameters, ``POST`` as a JSON body."""
        self.path = path
        """URL path; ``{name}`` parts are arguments."""
        self.path_params = tuple(_PATH_PARAM.findall(path))
        """Arguments that travel in the path."""
        self.tag = tag
        """OpenAPI tag."""
        self.returns = returns
        """Response field holding the result; ``None`` when the result (a model) is the body."""
        self.idempotent = idempotent
        """Whether a try whose answer was lost may be repeated (see :mod:`agentbolt.store.http`)."""
        self.body = body
        """The argument that is the whole request body (a model), if any."""
        self.waits = waits
        """The argument giving seconds to wait (``None``: for ever): a client splits a wait into
        requests the server caps, until ``done(result)`` or the time is up."""
        self.done = done
        """For waiting operations: whether a result ends the wait."""
        self.reports_done = reports_done
        """The response also says ``done`` (what :attr:`done` says of the result)."""
        self.prepare = prepare
        """Checks across arguments, or fills them in, after validation: takes and returns the request."""
        self.lost_answer = lost_answer
        """What a repeated try after a lost answer may have left behind (logged when it happens)."""
        self.recover = recover
        """When a try repeated after a lost answer is refused as stale (``StaleAttemptError``),
        ``await recover(store, request)`` gives the result if the lost try had applied, else ``None``."""
        self.handler = f"_{self.name}"
        """The backend coroutine implementing the operation."""
        self._fn = fn
        doc = inspect.getdoc(fn) or ""
        self.summary, self.description, self.arg_docs = _parse_doc(doc)

    def __repr__(self) -> str:
        return f"<operation {self.name}: {self.method} {self.path}>"

    # -- the declaration --------------------------------------------------------------------------

    @cached_property
    def parameters(self) -> dict[str, inspect.Parameter]:
        """The declared parameters (without ``self``), annotations evaluated."""
        hints = typing.get_type_hints(self._fn, include_extras=True)
        params = list(inspect.signature(self._fn).parameters.values())[1:]
        return {p.name: p.replace(annotation=hints[p.name]) for p in params}

    @cached_property
    def result_type(self) -> Any:
        """The declared return type."""
        return typing.get_type_hints(self._fn, include_extras=True)["return"]

    @cached_property
    def _positional(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD)

    @cached_property
    def _required(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parameters.values() if p.default is p.empty)

    # -- derived models ---------------------------------------------------------------------------

    @cached_property
    def request(self) -> type[BaseModel]:
        """Every argument, validated: what the Python method checks and the backend receives
        (also the wire request when every argument travels in it)."""
        whole = not self.path_params and self.body is None
        return self._model(f"{_camel(self.name)}{'Request' if whole else 'Arguments'}", self.parameters)

    @cached_property
    def wire_request(self) -> type[BaseModel] | None:
        """What travels besides the path: the JSON body of a ``POST``, the query of a ``GET``
        (``None`` when nothing does)."""
        if self.body is not None:
            return typing.cast(type[BaseModel], self.parameters[self.body].annotation)
        rest = {n: p for n, p in self.parameters.items() if n not in self.path_params}
        if not rest:
            return None
        if len(rest) == len(self.parameters):
            return self.request
        return self._model(f"{_camel(self.name)}Request", rest)

    @cached_property
    def response(self) -> type[BaseModel]:
        """The answer's body: ``{returns: result}`` (plus ``done``), or the result itself."""
        if self.returns is None:
            if not (inspect.isclass(self.result_type) and issubclass(self.result_type, BaseModel)):
                raise TypeError(f"{self.name}: an operation without 'returns' must return a model")
            return self.result_type
        fields: dict[str, Any] = {self.returns: (self.result_type, Field(description=self.summary))}
        if self.reports_done:
            fields["done"] = (bool, Field(description="True when the wait is over; otherwise wait again."))
        return create_model(
            f"{_camel(self.name)}Response", __config__=WIRE_CONFIG, __doc__=f"Answer of ``{self.name}``.", **fields
        )

    @cached_property
    def _result_adapter(self) -> TypeAdapter[Any]:
        return TypeAdapter(self.result_type)

    def _model(self, name: str, params: dict[str, inspect.Parameter]) -> type[BaseModel]:
        fields = {
            n: (
                p.annotation,
                Field(
                    default=... if p.default is p.empty else p.default,
                    description=self.arg_docs.get(n),
                ),
            )
            for n, p in params.items()
        }
        doc = f"``{self.name}``: {self.summary}"
        return create_model(name, __config__=WIRE_CONFIG, __doc__=doc, **fields)  # type: ignore[call-overload]  # fields built at run time

    # -- calls --------------------------------------------------------------------------------------

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> BaseModel:
        """The validated request of a Python call (``TypeError`` as Python would raise it,
        :class:`~agentbolt.errors.UserError` for a bad value)."""
        if len(args) > len(self._positional):
            raise TypeError(
                f"{self.name}() takes {len(self._positional)} positional arguments but {len(args)} were given"
            )
        values = dict(zip(self._positional, args, strict=False))
        for key in kwargs:
            if key in values:
                raise TypeError(f"{self.name}() got multiple values for argument {key!r}")
            if key not in self.parameters:
                raise TypeError(f"{self.name}() got an unexpected keyword argument {key!r}")
        values.update(kwargs)
        missing = [n for n in self._required if n not in values]
        if missing:
            raise TypeError(f"{self.name}() missing required argument: {missing[0]!r}")
        request = self.validate(values)
        if self.prepare is not None:
            request = self.prepare(request) or request
        return request

    def validate(self, values: dict[str, Any]) -> BaseModel:
        """:attr:`request` from argument values; a refused value raises ``UserError`` (or the
        agentbolt error a validator raised, e.g. ``SchemaError``)."""
        try:
            return self.request.model_validate(values)
        except ValidationError as exc:
            raise self._error(exc) from None

    def _error(self, exc: ValidationError) -> Exception:
        problems = exc.errors(include_url=False)
        for problem in problems:
            cause = (problem.get("ctx") or {}).get("error")
            if isinstance(cause, AgentboltError):
                return cause
        parts = []
        for problem in problems[:5]:
            where = ".".join(str(x) for x in problem["loc"]) or "arguments"
            parts.append(f"{where}: {problem['msg']}")
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        return UserError(f"{self.name}(): " + "; ".join(parts) + more)

    def arguments(self, request: BaseModel) -> dict[str, Any]:
        """The request as keyword arguments (of the backend's handler or the Python method)."""
        return dict(request.__dict__)

    def answer(self, result: Any) -> BaseModel:
        """The response body for ``result`` (no validation: the store made it)."""
        if self.returns is None:
            return typing.cast(BaseModel, result)
        fields = {self.returns: result}
        if self.reports_done:
            fields["done"] = bool(self.done(result)) if self.done is not None else True
        return self.response.model_construct(**fields)

    def read_answer(self, content: bytes) -> Any:
        """The result in a response body."""
        if self.returns is None:
            return self.response.model_validate_json(content)
        return getattr(self.response.model_validate_json(content), self.returns)


def operation(
    route: str,
    *,
    tag: str,
    returns: str | None = None,
    idempotent: bool = True,
    body: str | None = None,
    waits: str | None = None,
    done: Callable[[Any], bool] | None = None,
    reports_done: bool = False,
    prepare: Callable[[Any], Any] | None = None,
    lost_answer: str | None = None,
    recover: Callable[[Any, Any], Awaitable[Any]] | None = None,
) -> Callable[[F], F]:
    """Declare the decorated method of :class:`~agentbolt.store.Store` a store operation.

    Args:
        route: ``"POST /v1/rollouts/dequeue"``; ``{name}`` parts of the path are arguments.
        tag: the OpenAPI tag.
        returns: the response field that holds the result (``None``: the result is the body).
        idempotent: a try whose answer was lost may be repeated.
        body: the argument that is the whole request body.
        waits: the argument giving seconds to wait; requires ``done``.
        done: for waiting operations, whether a result ends the wait.
        reports_done: the response also carries ``done``.
        prepare: checks across arguments (or fills them in), run on the validated request.
        lost_answer: what a repeated try after a lost answer may leave behind.
        recover: ``(store, request) -> result | None``: whether a lost try had applied, when its
            repetition is refused as stale.
    """

    def decorate(fn: F) -> F:
        op = Operation(
            fn,
            route,
            tag=tag,
            returns=returns,
            idempotent=idempotent,
            body=body,
            waits=waits,
            done=done,
            reports_done=reports_done,
            prepare=prepare,
            lost_answer=lost_answer,
            recover=recover,
        )

        @functools.wraps(fn)
        async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await self._dispatch(op, op.bind(args, kwargs))

        call.operation = op  # type: ignore[attr-defined]  # read back by operation_of() and operations()
        return call  # type: ignore[return-value]  # fn's signature (functools.wraps), which mypy cannot tie to call's

    return decorate


def operation_of(method: Callable[..., Any]) -> Operation:
    """The :class:`Operation` a store method declares (``TypeError`` for another method)."""
    op = getattr(method, "operation", None)
    if not isinstance(op, Operation):
        raise TypeError(f"{getattr(method, '__qualname__', method)!r} is not a declared store operation")
    return op


def operations(store_class: type) -> Iterator[Operation]:
    """The operations declared on ``store_class`` and its bases, in declaration order."""
    seen: set[str] = set()
    for cls in store_class.__mro__:
        for value in vars(cls).values():
            op = getattr(value, "operation", None)
            if isinstance(op, Operation) and op.name not in seen:
                seen.add(op.name)
                yield op


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _parse_doc(doc: str) -> tuple[str, str, dict[str, str]]:
    """(first line, text before the sections, ``{argument: description}`` of ``Args:``)."""
    lines = doc.splitlines()
    summary = lines[0].strip() if lines else ""
    text: list[str] = []
    args: dict[str, str] = {}
    current: str | None = None
    section = None
    for line in lines:
        stripped = line.strip()
        if stripped in ("Args:", "Returns:", "Raises:"):
            section = stripped
            continue
        if section is None:
            text.append(line)
            continue
        if section != "Args:":
            continue
        match = re.match(r"^ {4}(\w+)(?: \([^)]*\))?: (.*)$", line)
        if match:
            current = match.group(1)
            args[current] = match.group(2).strip()
        elif current is not None and stripped:
            args[current] += " " + stripped
    return summary, "\n".join(text).strip(), args
