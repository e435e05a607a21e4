"""The five registration hooks plugins implement.

Each hook hands the plugin a ``register`` callable; behaviour lives on the registered
classes, so the hooks stay stable as plugins evolve. Implement them with
``from agentbolt import hookimpl``::

    from agentbolt import hookimpl

    @hookimpl
    def agentbolt_register_stores(register):
        register("redis", make_redis_store)   # factory(url: str, **options) -> Store
"""

from __future__ import annotations

from typing import Any, Protocol

import pluggy

__all__ = ["Register", "hookimpl", "hookspec"]

PROJECT = "agentbolt"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class Register(Protocol):
    """The callable a registration hook receives: ``register(name, implementation)``."""

    def __call__(self, name: str, implementation: Any, /) -> None: ...


@hookspec
def agentbolt_register_stores(register: Register) -> None:
    """Register store backends by URL scheme: ``register("sqlite", factory)``.

    ``factory(url: str, **options) -> agentbolt.store.Store`` opens the backend for a URL.
    """


@hookspec
def agentbolt_register_algorithms(register: Register) -> None:
    """Register training algorithms: ``register("torch-grpo", factory)``.

    ``factory(**config) -> agentbolt.algorithm.Algorithm``. A factory may also have an async
    ``describe_run(run, store)`` method returning what ``agentbolt runs show`` prints under the
    metrics of a run of that algorithm (anything ``rich`` can print, or ``None``).
    """


@hookspec
def agentbolt_register_adapters(register: Register) -> None:
    """Register framework adapters: ``register("langchain", factory)``.

    ``factory() -> adapter`` with ``instrument()`` / ``uninstrument()``.
    """


@hookspec
def agentbolt_register_credit(register: Register) -> None:
    """Register credit assigners and advantage estimators: ``register("air", implementation)``.

    The kind (credit assigner or advantage estimator) is taken from the implementation's type.
    """


@hookspec
def agentbolt_register_environments(register: Register) -> None:
    """Register kinds of environment an agent can be given as: ``register("verifiers", kind)``.

    ``kind`` has ``accepts(obj) -> bool`` (whether ``obj``, say an environment object of the
    plugin's framework, is one of its environments) and ``agent(obj_or_name) -> agent`` (the
    agentbolt agent that runs it: a function or an object with ``rollout``). A string
    ``"verifiers://NAME"`` given as the agent (``Trainer``, ``agentbolt runner``) is handed to the
    kind registered as ``verifiers`` with ``NAME``. See :mod:`agentbolt.environments`.
    """
