"""The lifecycle every adapter shares (:class:`Adapter`: version check, install once per process,
idempotent instrument/uninstrument) and how runners instrument the installed adapters
(:func:`instrument_adapters`, :func:`capture_span`)."""

from __future__ import annotations

import abc
import importlib
import importlib.metadata
import logging
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar, cast

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from ... import semconv
from ... import types as t
from ...errors import MissingDependencyError, UserError
from ...plugins.registry import default_plugins

if TYPE_CHECKING:
    from .hooks import AdapterHooks
    from .recorder import SpanRecorder

__all__ = ["Adapter", "capture_span", "check_distribution", "instrument_adapters"]

log = logging.getLogger(__name__)

_SHARED_LOCK = threading.Lock()


class Adapter(abc.ABC):
    """Base class of framework adapters: the lifecycle every adapter shares.

    Subclasses set :attr:`name`, :attr:`distribution` (the framework's distribution, whose
    version is checked), :attr:`supported` (a PEP 440 specifier) and :attr:`hooks_class` (or
    override :meth:`make_hooks`), which names the adapter's :class:`AdapterHooks` (the framework
    translation). The hooks are process-wide: built once per adapter class, on the class (the
    one place an adapter's state lives), installed into the framework when the first instance is
    instrumented and removed when the last one is uninstrumented, so two instances never record
    a unit twice. ``instrument()`` and ``uninstrument()`` are idempotent and thread-safe; an
    ``instrument()`` that raises leaves nothing installed, and :func:`instrument_adapters`
    reports why (runners record it for ``agentbolt dev`` / ``agentbolt doctor``).
    """

    name: ClassVar[str] = "adapter"
    distribution: ClassVar[str] = ""
    supported: ClassVar[str] = ""
    auto: ClassVar[bool] = True
    """Instrumented by runners that instrument every installed adapter (``adapters=None``, the
    default); ``False``: an opt-in adapter, instrumented only when named (``adapters=[...]``)."""
    hooks_class: ClassVar[str] = ""
    """The adapter's :class:`AdapterHooks` subclass as ``"module:Class"`` (``".module:Class"``:
    relative to the adapter's package), imported by :meth:`make_hooks` only, so that importing
    the adapter imports neither the hooks module nor the framework."""
    _shared_hooks: ClassVar[AdapterHooks]
    """Set by :meth:`shared_hooks` on each concrete class (in its own ``__dict__``, never inherited)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._instrumented = False

    @classmethod
    def make_hooks(cls) -> AdapterHooks:
        """Build the process's hooks into the framework (imports the framework; called once):
        ``hooks_class(name)``; override it where the hooks are built otherwise."""
        module, _, qualname = cls.hooks_class.partition(":")
        if not module or not qualname:
            raise TypeError(f"{cls.__name__} must set hooks_class ('module:Class') or override make_hooks")
        hooks_type = getattr(importlib.import_module(module, cls.__module__.rpartition(".")[0]), qualname)
        return cast("AdapterHooks", hooks_type(cls.name))

    @classmethod
    def shared_hooks(cls) -> AdapterHooks:
        """The process's hooks of this adapter class (built on first use)."""
        hooks = cls.__dict__.get("_shared_hooks")
        if hooks is None:
            with _SHARED_LOCK:
                hooks = cls.__dict__.get("_shared_hooks")
                if hooks is None:
                    hooks = cls.make_hooks()
                    cls._shared_hooks = hooks
        return hooks

    @property
    def hooks(self) -> AdapterHooks:
        """The hooks shared by every instance of this adapter class."""
        return type(self).shared_hooks()

    @property
    def recorder(self) -> SpanRecorder:
        """The recorder the hooks hand units to (shared by every instance, for the process)."""
        return self.hooks.recorder

    @property
    def instrumented(self) -> bool:
        return self._instrumented

    def check_version(self) -> str:
        """The installed framework version; raises a clear error when missing or unsupported."""
        return check_distribution(self.distribution, self.supported, f"the {self.name} adapter")

    def instrument(self) -> None:
        """Start recording the framework's runs as spans (no-op if already instrumented)."""
        with self._lock:
            if self._instrumented:
                return
            self.check_version()
            self.hooks.acquire(self)
            self._instrumented = True

    def uninstrument(self) -> None:
        """Stop recording (no-op if not instrumented)."""
        with self._lock:
            if not self._instrumented:
                return
            self.hooks.release(self)
            self._instrumented = False


def check_distribution(distribution: str, supported: str, what: str) -> str:
    """The installed version of ``distribution``; a clear error when it is missing or outside
    the PEP 440 specifier ``supported`` (empty: any version)."""
    try:
        installed = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise MissingDependencyError(distribution, distribution, what) from None
    if supported and Version(installed) not in SpecifierSet(supported):
        raise UserError(
            f"{what} supports {distribution}{supported}, but {installed} is installed; "
            f"install a supported version (pip install '{distribution}{supported}')"
        )
    return installed


def capture_span(adapters: Iterable[Adapter], failures: Iterable[str]) -> t.Span:
    """The ``agentbolt.capture`` span a runner records on each attempt: which adapters record it
    and which failed to instrument (``agentbolt doctor`` reports both)."""
    attrs: dict[str, t.AttributeValue] = {
        semconv.SPAN_KIND_ATTR: "capture",
        semconv.CAPTURE_ADAPTERS: [str(a.name) for a in adapters],
        semconv.CAPTURE_ADAPTER_FAILURES: list(failures),
    }
    return t.Span.create(semconv.SPAN_CAPTURE, attributes=attrs)


def instrument_adapters(
    names: Iterable[str] | None = None, *, plugins: Any = None, failures: list[str] | None = None
) -> list[Adapter]:
    """Instrument installed adapter plugins; returns the ones now active.

    ``names=None`` instruments every registered adapter whose framework is installed (others
    are skipped quietly), except opt-in ones (``Adapter.auto = False``); a list instruments exactly those (an error if one is missing).
    Failures of individual adapters are logged, never raised, when ``names`` is ``None``, and
    appended to ``failures`` (as ``"name: why"``) when given: runners record them for ``agentbolt doctor``.
    """
    if plugins is None:
        plugins = default_plugins()
    active: list[Adapter] = []
    wanted = None if names is None else list(names)
    for entry in plugins.adapters:
        if wanted is not None and entry.name not in wanted:
            continue
        try:
            adapter = entry.value()
            if wanted is None and not adapter.auto:
                continue
            adapter.instrument()
            active.append(adapter)
        except MissingDependencyError as exc:
            if wanted is not None:
                raise
            log.debug("adapter %s not used: %s", entry.name, exc)
        except Exception as exc:
            if wanted is not None:
                raise
            log.warning("adapter %s could not be instrumented: %s", entry.name, exc)
            if failures is not None:
                failures.append(f"{entry.name}: {exc}")
    if wanted is not None:
        missing = set(wanted) - {a.name for a in active}
        if missing:
            raise UserError(f"adapters not registered: {sorted(missing)}; registered: {plugins.adapters.names()}")
    return active
