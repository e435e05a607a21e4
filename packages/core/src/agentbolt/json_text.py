"""JSON text of a JSON value, written by orjson (fast) and, for what orjson cannot write (an integer
beyond 64 bits, which the standard library's parser returns for a long literal in, say, a tool call's
arguments), by the standard library: the same compact UTF-8 text either way.

Only orjson and :mod:`json` are imported, so any module can use it without import cost."""

from __future__ import annotations

import json
from typing import Any

import orjson

__all__ = ["json_bytes", "json_str"]


def json_str(value: Any) -> str:
    """``value`` as compact JSON text (non-ASCII characters as they are, no spaces).

    Raises :class:`TypeError` for what neither library can write."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def json_bytes(value: Any) -> bytes:
    """``value`` as compact JSON text encoded as UTF-8 (what :func:`json_str` writes)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
