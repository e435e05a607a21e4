"""What goes wrong between a rollout and an OpenEnv server, each error saying what to do.

- :class:`OpenEnvServerError`: the server could not be reached, refused a session (at capacity,
  its environment factory raised), dropped the session or did not answer in time. The message
  names the URL and what to do.
- :class:`OpenEnvStepError`: the server answered a ``reset`` or ``step`` with an error: the
  environment raised (``EXECUTION_ERROR``).
- :class:`OpenEnvActionError`: the server refused an action that does not match its action schema
  (``VALIDATION_ERROR``). The session stays open: the default loop shows the model the error
  and lets it try again; a loop of your own may catch it too.
"""

from __future__ import annotations

from agentbolt.errors import AgentboltError

__all__ = ["OpenEnvActionError", "OpenEnvServerError", "OpenEnvStepError"]


class OpenEnvServerError(AgentboltError, ConnectionError):
    """The OpenEnv server could not be reached, refused or dropped the session, or timed out."""

    def __init__(self, message: str, *, url: str, code: str | None = None) -> None:
        super().__init__(message)
        self.url = url
        """The server's base URL."""
        self.code = code
        """OpenEnv's error code (``CAPACITY_REACHED``, ``FACTORY_ERROR``...), when the server sent one."""


class OpenEnvStepError(AgentboltError, RuntimeError):
    """The server answered ``reset`` or ``step`` with an error (the environment raised)."""

    def __init__(self, message: str, *, url: str, code: str) -> None:
        super().__init__(message)
        self.url = url
        """The server's base URL."""
        self.code = code
        """OpenEnv's error code (``EXECUTION_ERROR``, ``VALIDATION_ERROR``...)."""


class OpenEnvActionError(OpenEnvStepError):
    """The server refused the action: it does not match the environment's action schema.

    The session is still open and the episode unchanged: the action counted as a turn, no step.
    """
