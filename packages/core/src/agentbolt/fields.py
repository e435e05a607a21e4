"""Field types of the data interface (:mod:`agentbolt.types`): OpenTelemetry attribute values,
JSON a store can keep, 64-bit integers, ids, and the model configurations the models share."""

from __future__ import annotations

import math
import secrets
from typing import Annotated, Any

from pydantic import AfterValidator, ConfigDict, Field, JsonValue, WithJsonSchema

from .errors import UserError

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "AttributeValue",
    "Attributes",
    "Int64",
    "Json",
    "JsonDict",
    "NonNegInt64",
    "finite_number",
    "new_id",
]

AttributeValue = str | bool | int | float | list[str] | list[bool] | list[int] | list[float]
"""An OpenTelemetry attribute value: a primitive or a homogeneous list of primitives."""

_PRIMITIVES = (str, bool, int, float)


def _check_attributes(attrs: dict[str, Any]) -> dict[str, Any]:
    """Validate OpenTelemetry attribute values (checked in Python: a pydantic union of eight
    list/primitive types costs five times more to validate and serialize)."""
    for key, value in attrs.items():
        if type(value) in _PRIMITIVES:
            if type(value) is float and not math.isfinite(value):
                raise ValueError(f"attribute {key!r} is {value}: only finite numbers can be stored")
            if type(value) is int and not -(2**63) <= value < 2**63:
                raise ValueError(f"attribute {key!r} is {value}, beyond 64 bits: send it as a string")
            continue
        if isinstance(value, tuple):
            value = attrs[key] = list(value)
        if isinstance(value, list):
            if not value:
                continue
            kinds = {type(v) for v in value}
            if float in kinds and not all(math.isfinite(v) for v in value if type(v) is float):
                raise ValueError(
                    f"attribute {key!r} holds non-finite numbers (NaN or infinity): only finite numbers can be stored"
                )
            if int in kinds and not all(-(2**63) <= v < 2**63 for v in value if type(v) is int):
                raise ValueError(f"attribute {key!r} holds integers beyond 64 bits: send them as strings")
            if len(kinds) == 1 and kinds <= set(_PRIMITIVES):
                continue
            if kinds <= {int, float}:  # e.g. logprobs [0, -0.5]: a float list
                attrs[key] = [float(v) for v in value]
                continue
            raise ValueError(
                f"attribute {key!r}: a list must hold one primitive type (str, bool, int or float), "
                f"got {sorted(k.__name__ for k in kinds)}"
            )
        if isinstance(value, _PRIMITIVES):  # subclasses such as str enums
            attrs[key] = _PRIMITIVES[[isinstance(value, p) for p in _PRIMITIVES].index(True)](value)
            continue
        raise ValueError(
            f"attribute {key!r}: {type(value).__name__} is not an OpenTelemetry attribute value; "
            "use str, bool, int, float or a list of one of them (JSON-encode structured values)"
        )
    return attrs


_ATTRIBUTE_SCHEMA = {
    "type": "object",
    "additionalProperties": {
        "anyOf": [
            {"type": "string"},
            {"type": "boolean"},
            {"type": "integer"},
            {"type": "number"},
            {"type": "array", "items": {"type": "string"}},
            {"type": "array", "items": {"type": "boolean"}},
            {"type": "array", "items": {"type": "integer"}},
            {"type": "array", "items": {"type": "number"}},
        ]
    },
}

Attributes = Annotated[dict[str, Any], AfterValidator(_check_attributes), WithJsonSchema(_ATTRIBUTE_SCHEMA)]
"""A mapping of attribute names to :data:`AttributeValue` values."""

FROZEN = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)
"""Models that are stored or travel between processes: floats must be finite (a NaN lease is
never swept, a NaN reward poisons training)."""
FROZEN_ANY_FLOAT = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)
"""Computed models (transitions) whose floats may be infinite, e.g. a logprob of ``-inf``."""

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
"""An integer that fits a 64-bit column (databases and JSON encoders refuse larger ones)."""
NonNegInt64 = Annotated[int, Field(ge=0, le=INT64_MAX)]
"""A non-negative :data:`Int64` (timestamps in nanoseconds, counters, sequence numbers)."""


def _check_json(value: Any, where: str = "value") -> Any:
    """Refuse JSON values a store cannot keep: integers beyond 64 bits, NaN and infinities."""
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is int:
            if not INT64_MIN <= item <= INT64_MAX:
                raise ValueError(f"{where} holds the integer {item}, beyond 64 bits; send it as a string")
        elif type(item) is float:
            if not math.isfinite(item):
                raise ValueError(f"{where} holds {item}: only finite numbers can be stored")
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return value


Json = Annotated[JsonValue, AfterValidator(_check_json)]
"""A JSON value a store can keep: 64-bit integers, finite numbers."""
JsonDict = Annotated[dict[str, JsonValue], AfterValidator(_check_json)]
"""A JSON object a store can keep."""


def new_id(prefix: str = "") -> str:
    """A random, URL-safe id (16 hex chars of randomness) with an optional prefix like ``ro-``."""
    return f"{prefix}{secrets.token_hex(8)}"


def finite_number(value: object, what: str, *, bools: bool = False) -> float:
    """``value`` as a finite float, else a :class:`~agentbolt.errors.UserError` naming ``what``:
    not a number (a bool counts as one only with ``bools``), NaN, an infinity, or an integer
    beyond the float range."""
    if isinstance(value, bool) and bools:
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UserError(f"{what} must be a number, got {type(value).__name__}: {value!r}")
    try:
        number = float(value)
    except OverflowError:
        raise UserError(f"{what} must be a finite number, got an integer of {len(str(value))} digits") from None
    if not math.isfinite(number):
        raise UserError(f"{what} must be a finite number, got {value}")
    return number
