"""Every exception agentbolt raises, split by audience.

- :class:`UserError`: the caller misused the API (bad argument, unknown name, wrong state).
- :class:`PluginError`: a plugin failed to load or register; names its distribution.
- :class:`SchemaError`: data did not match the schema (malformed span, bad JSON).
- :class:`StoreError` and its subclasses: a store operation was refused. Each names the ids
  involved and what to do; nothing is half-written when one is raised.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError

__all__ = [
    "AgentboltError",
    "AuthenticationError",
    "ConflictError",
    "InvalidTransitionError",
    "MissingDependencyError",
    "NotFoundError",
    "PluginError",
    "SchemaError",
    "StaleAttemptError",
    "StoreError",
    "StoreUnavailableError",
    "UserError",
    "invalid_fields_message",
]


class AgentboltError(Exception):
    """Base class of every agentbolt exception."""


class UserError(AgentboltError, ValueError):
    """The API was used wrongly: the message says what to change."""


class AuthenticationError(UserError):
    """A server refused the credentials (missing or wrong bearer token)."""


class MissingDependencyError(UserError, ImportError):
    """An optional dependency is not installed; the message names the package to install."""

    def __init__(self, module: str, package: str, purpose: str) -> None:
        super().__init__(
            f"{purpose} needs the Python package {module!r}, which is not installed. "
            f"Install it with: pip install {package}"
        )
        self.module = module
        self.package = package


class SchemaError(AgentboltError, ValueError):
    """Data does not match agentbolt's schema (a malformed span, an invalid attribute)."""


class PluginError(AgentboltError):
    """A plugin could not be loaded or registered.

    Attributes:
        plugin: the plugin's entry-point name (or module name for built-ins).
        distribution: the distribution that ships it, e.g. ``"agentbolt-langchain 0.1.0"``.
    """

    def __init__(self, plugin: str, distribution: str | None, message: str) -> None:
        where = f"plugin {plugin!r}" + (f" from distribution {distribution!r}" if distribution else "")
        super().__init__(f"{where}: {message}")
        self.plugin = plugin
        self.distribution = distribution
        self.detail = message


class StoreError(AgentboltError):
    """A store operation was refused. Subclasses say why."""


class NotFoundError(StoreError, KeyError):
    """An id (rollout, attempt, resources version) does not exist in the store."""

    def __init__(self, what: str, ids: object) -> None:
        super().__init__(f"unknown {what}: {ids}")
        self.what = what
        self.ids = ids

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return str(self.args[0])


class InvalidTransitionError(StoreError):
    """A status change is not allowed (e.g. a finished rollout cannot return to running)."""


class StaleAttemptError(InvalidTransitionError):
    """A report came from an attempt that is no longer current (lost, timed out or superseded).

    The report is rejected, not applied: the attempt's worker should stop its agent.
    """


class ConflictError(StoreError):
    """An idempotent write was repeated with different content (same id, different data)."""


class StoreUnavailableError(StoreError):
    """The store could not be reached (network, server down); the operation may be retried."""


def invalid_fields_message(title: str, exc: ValidationError, *, unknown: str | None = None) -> str:
    """A pydantic validation error as ``title:`` and one ``  field: message`` line per error.

    ``unknown`` replaces pydantic's message for a field the model does not have (say which are
    valid, e.g. ``unknown option; valid: a, b``); pydantic's ``Value error, `` prefix is dropped.
    """
    lines = [f"{title}:"]
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if unknown is not None and err["type"] == "extra_forbidden":
            msg = unknown
        lines.append(f"  {where}: {msg}")
    return "\n".join(lines)
