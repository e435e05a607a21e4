"""An adapter's hooks into its framework (:class:`AdapterHooks`): installed once per process while
an instance is instrumented, framework methods patched and put back, errors kept from the
framework, capture problems told to the user."""

from __future__ import annotations

import abc
import contextlib
import functools
import inspect
import logging
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .recorder import SpanRecorder

if TYPE_CHECKING:
    from .lifecycle import Adapter

__all__ = ["AdapterHooks"]

log = logging.getLogger(__name__)


class AdapterHooks(abc.ABC):
    """An adapter's hooks into its framework (a callback handler, a trace or span processor, a
    patched method): one object per adapter class and process, shared by every instance.

    :meth:`install` runs when the first instance is instrumented and :meth:`uninstall` when the
    last one is uninstrumented (both under :attr:`lock`); :attr:`active` says, without a lock,
    whether framework callbacks should record. Callbacks translate framework events into
    :class:`UnitRecord` s for :attr:`recorder`, and never raise into the framework: decorate them
    with :func:`never_raises` (``when_active=True`` also skips them while inactive), or call
    :meth:`guard` in an ``except``. Capture problems the user must act on go through :meth:`warn`.
    Where a framework has no hook point, :meth:`wrap` (or :meth:`patch`) replaces one of its
    methods until uninstall.
    """

    def __init__(self, adapter: str) -> None:
        self.adapter = adapter
        self.recorder = SpanRecorder(adapter)
        self.lock = threading.RLock()
        """Guards install/uninstall and the hooks' own maps."""
        self.active = False
        """Whether callbacks record (read without the lock: a plain attribute read is atomic)."""
        self._owners: list[Adapter] = []
        self._said: set[str] = set()
        self._patches: list[tuple[type, str, Any, Any]] = []

    @property
    def owner(self) -> Adapter | None:
        """The first instrumented instance (whose options apply), or ``None``."""
        owners = self._owners
        return owners[0] if owners else None

    @property
    def errors(self) -> int:
        """Translation errors swallowed for the process (each kind is logged once)."""
        return self.recorder.errors

    def check(self) -> None:  # noqa: B027 - optional hook
        """Raise a clear error when the framework is configured so that capture cannot work
        (called by every ``instrument()``, before :meth:`install`)."""

    @abc.abstractmethod
    def install(self) -> None:
        """Hook into the framework (idempotent across install/uninstall cycles)."""

    @abc.abstractmethod
    def uninstall(self) -> None:
        """Unhook from the framework, or make the hooks inert where it offers no way to unhook
        (the base class then puts back patched methods and forgets open units)."""

    def acquire(self, adapter: Adapter) -> None:
        """``adapter`` is instrumented: install the hooks if it is the first."""
        with self.lock:
            self.check()
            if not self.active:
                try:
                    self.install()
                except BaseException:
                    with contextlib.suppress(Exception):
                        self.uninstall()
                    self._unpatch()
                    raise
                self.active = True
            if not any(o is adapter for o in self._owners):
                self._owners.append(adapter)

    def release(self, adapter: Adapter) -> None:
        """``adapter`` is uninstrumented: uninstall the hooks if it was the last."""
        with self.lock:
            self._owners = [o for o in self._owners if o is not adapter]
            if self._owners or not self.active:
                return
            self.active = False
            try:
                self.uninstall()
            finally:
                self._unpatch()
                self.recorder.discard_all()

    def patch(self, owner: type, name: str, wrap: Callable[[Any], Any]) -> bool:
        """Replace the framework method ``owner.name`` by ``wrap(original)`` until the hooks are
        uninstalled (for frameworks without a hook point where one is needed). The wrapper should
        do its work only while :attr:`active`. Returns False when ``owner`` defines no ``name``
        (a framework version that changed: say so with :meth:`warn`)."""
        original = owner.__dict__.get(name)
        if original is None:
            return False
        if getattr(original, "__agentbolt_hooks__", None) is self:
            return True  # ours is still in place, possibly under someone else's wrapper (functools.wraps)
        replacement = wrap(original)
        replacement.__agentbolt_hooks__ = self
        setattr(owner, name, replacement)
        self._patches.append((owner, name, original, replacement))
        return True

    def wrap(
        self,
        owner: type,
        name: str,
        *,
        before: Callable[[Mapping[str, Any]], Any] | None = None,
        after: Callable[[Mapping[str, Any], Any, Any], Any] | None = None,
        needs: Iterable[str] = (),
    ) -> bool:
        """:meth:`patch` ``owner.name`` (a function or coroutine function) with the usual wrapper:
        while :attr:`active`, ``before(call)`` sees the call's arguments by name (those passed,
        ``self`` included) and returns a state; unless it returned ``None``, ``after(call, state,
        result)`` then returns what the caller gets instead of ``result``. The original always
        runs, with the caller's arguments; an error in ``before`` or ``after`` is :meth:`guard`-ed
        and the call goes on as if unwrapped. Returns False (nothing patched) when the method is
        missing or lacks one of the parameters in ``needs``: say so with :meth:`warn`."""
        try:
            signature = inspect.signature(owner.__dict__[name])
        except (KeyError, TypeError, ValueError):
            return False
        if not set(needs) <= set(signature.parameters):
            return False
        hooks = self

        def enter(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Mapping[str, Any], Any] | None:
            try:
                call = signature.bind(*args, **kwargs).arguments
                state = before(call) if before is not None else ()
            except Exception as exc:
                hooks.guard(f"reading a {name} call", exc)
                return None
            return None if state is None else (call, state)

        def leave(entered: tuple[Mapping[str, Any], Any] | None, result: Any) -> Any:
            if entered is None or after is None:
                return result
            try:
                return after(entered[0], entered[1], result)
            except Exception as exc:
                hooks.guard(f"reading a {name} result", exc)
                return result

        def make(original: Any) -> Any:
            if inspect.iscoroutinefunction(original):

                @functools.wraps(original)
                async def wrapper_async(*args: Any, **kwargs: Any) -> Any:
                    if not hooks.active:
                        return await original(*args, **kwargs)
                    entered = enter(args, kwargs)
                    return leave(entered, await original(*args, **kwargs))

                return wrapper_async

            @functools.wraps(original)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if not hooks.active:
                    return original(*args, **kwargs)
                entered = enter(args, kwargs)
                return leave(entered, original(*args, **kwargs))

            return wrapper

        return self.patch(owner, name, make)

    def _unpatch(self) -> None:
        """Put back what :meth:`patch` replaced (unless someone replaced our wrapper since: theirs
        keeps calling ours, which passes through once inactive)."""
        while self._patches:
            owner, name, original, replacement = self._patches.pop()
            if owner.__dict__.get(name) is replacement:
                setattr(owner, name, original)

    def guard(self, what: str, exc: BaseException) -> None:
        """Count and log (once per kind) an error of the translation code; the framework never sees it."""
        self.recorder.guard(what, exc)

    def warn(
        self, kind: str, message: str, category: type[Warning] = UserWarning, *, level: int = logging.WARNING
    ) -> None:
        """A capture problem the user must act on: a warning each time (Python's filters show it
        once per place) and a log line at ``level`` once per ``kind``. Never raises, not even
        when warnings are turned into errors."""
        with contextlib.suppress(Exception):
            warnings.warn(message, category, stacklevel=3)
        if kind not in self._said:
            self._said.add(kind)
            log.log(level, "%s adapter: %s", self.adapter, message)
