"""The plugin manager: discovers plugins, isolates broken ones, and holds the registries.

Plugins are modules (or objects) with ``@hookimpl`` functions, advertised through the
``agentbolt.plugins`` entry-point group. Loading is lazy (on first use of a registry), and
guarded: a plugin that fails to import, fails validation or raises while registering is
reported as a :class:`~agentbolt.errors.PluginError` naming its distribution, and every
other plugin still loads.

The environment variable ``AGENTBOLT_PLUGINS`` restricts which entry-point plugins load:
unset loads all, empty loads only the built-ins, otherwise a comma-separated list of
entry-point or distribution names.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import logging
import os
import re
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Generic, TypeVar

import pluggy

from ..errors import PluginError, UserError
from . import hookspecs

__all__ = [
    "ENTRY_POINT_GROUP",
    "ENV_VAR",
    "PluginInfo",
    "PluginLoadWarning",
    "Plugins",
    "Registry",
    "default_plugins",
    "distribution_version",
    "lazy_factory",
]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "agentbolt.plugins"
ENV_VAR = "AGENTBOLT_PLUGINS"
BUILTIN_NAME = "agentbolt"
BUILTIN_PLUGINS = {"agentbolt.store": "agentbolt.store.plugin", "agentbolt.lightningrl": "agentbolt.lightningrl.plugin"}
"""Core's own plugins, plugin name -> module: each part registers its built-ins (store backends;
credit assigners and advantage estimators) through the same hooks as any plugin. Named by module,
like entry points, so the registry at the bottom of core depends on none of them."""

T = TypeVar("T")

# Hook name -> registry name. Credit implementations split into two registries by kind.
_HOOKS = {
    "agentbolt_register_stores": "stores",
    "agentbolt_register_algorithms": "algorithms",
    "agentbolt_register_adapters": "adapters",
    "agentbolt_register_credit": "credit",
    "agentbolt_register_environments": "environments",
}


# What the project's own plugin packages register, so that a name missing here says what to install.
FIRST_PARTY = {
    ("algorithm", "apo"): "agentbolt-apo",
    ("algorithm", "torch-grpo"): "agentbolt-torch",
    ("algorithm", "torch-sft"): "agentbolt-torch",
    ("adapter", "langchain"): "agentbolt-langchain",
    ("adapter", "autogen"): "agentbolt-autogen",
    ("adapter", "openai-agents"): "agentbolt-openai-agents",
    ("environment kind", "verifiers"): "agentbolt-verifiers",
}


class PluginLoadWarning(UserWarning):
    """Warned once for each plugin that failed to load; the host keeps running."""


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered implementation and who registered it."""

    name: str
    value: T
    plugin: str
    distribution: str | None


class Registry(Generic[T]):
    """Implementations of one kind by name (store backends by scheme, algorithms, ...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def add(self, entry: Entry[T]) -> None:
        """Add an entry; its name must be new."""
        if entry.name in self._entries:
            raise UserError(f"{self.kind} {entry.name!r} is already registered")
        self._entries[entry.name] = entry

    def discard(self, entry: Entry[T]) -> None:
        """Remove exactly this entry, if present."""
        if self._entries.get(entry.name) is entry:
            del self._entries[entry.name]

    def get(self, name: str) -> T:
        """The implementation named ``name``; a typo raises :class:`UserError` listing valid names."""
        try:
            return self._entries[name].value
        except KeyError:
            valid = ", ".join(sorted(self._entries)) or "(none registered)"
            missing = FIRST_PARTY.get((self.kind, name))
            hint = f" ({name!r} comes with {missing}: pip install {missing})" if missing else ""
            raise UserError(f"unknown {self.kind} {name!r}; valid names: {valid}{hint}") from None

    def entry(self, name: str) -> Entry[T]:
        """The full entry for ``name`` (raises like :meth:`get`)."""
        self.get(name)
        return self._entries[name]

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry[T]]:
        return iter(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)


@dataclass
class PluginInfo:
    """What ``agentbolt plugins`` shows for one plugin."""

    name: str
    """Entry-point name (or ``agentbolt`` for the built-ins)."""
    distribution: str | None
    """Distribution name."""
    version: str | None
    """Distribution version."""
    module: str | None = None
    """Module the plugin object came from."""
    registered: dict[str, list[str]] = field(default_factory=dict)
    """Registry name -> names this plugin registered."""
    error: PluginError | None = None
    """Why the plugin failed, if it did."""

    @property
    def ok(self) -> bool:
        """True when the plugin loaded and registered without error."""
        return self.error is None


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _credit_kind(value: Any) -> str:
    """``advantage`` for advantage estimators, else ``credit`` (assigners)."""
    kind = getattr(value, "registry_kind", "credit")
    if kind not in ("credit", "advantage"):
        raise TypeError(f"registry_kind must be 'credit' or 'advantage', not {kind!r}")
    return str(kind)


class Plugins:
    """A plugin manager plus the registries its plugins fill.

    Most code uses :func:`default_plugins`; tests build their own instance.

    Args:
        load_entry_points: discover plugins from the ``agentbolt.plugins`` entry points.
        environ: where ``AGENTBOLT_PLUGINS`` is read (defaults to ``os.environ``).
    """

    def __init__(self, *, load_entry_points: bool = True, environ: Mapping[str, str] | None = None) -> None:
        self._pm = pluggy.PluginManager(hookspecs.PROJECT)
        self._pm.add_hookspecs(hookspecs)
        self._load_entry_points = load_entry_points
        self._environ = os.environ if environ is None else environ
        self._lock = threading.RLock()
        self._loaded = False
        self._registries: dict[str, Registry[Any]] | None = None
        self._infos: dict[str, PluginInfo] = {}

    # -- loading ------------------------------------------------------------------------------

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        with self._lock:
            if self._loaded:
                return
            for name, module in BUILTIN_PLUGINS.items():
                self._add(importlib.import_module(module), name, _dist_of_module(BUILTIN_NAME))
            if self._load_entry_points:
                self._load_from_entry_points()
            self._loaded = True

    def _allowed(self) -> set[str] | None:
        raw = self._environ.get(ENV_VAR)
        if raw is None:
            return None
        return {_norm(x.strip()) for x in raw.split(",") if x.strip()}

    def _load_from_entry_points(self) -> None:
        allowed = self._allowed()
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            dist = ep.dist
            dist_name = dist.metadata["Name"] if dist is not None else None
            version = dist.version if dist is not None else None
            if (
                allowed is not None
                and _norm(ep.name) not in allowed
                and (dist_name is None or _norm(dist_name) not in allowed)
            ):
                log.debug("plugin %s skipped: not listed in %s", ep.name, ENV_VAR)
                continue
            if ep.name in self._infos:
                continue
            try:
                obj = ep.load()
            except Exception as exc:  # a broken plugin must not break the host
                self._fail(PluginInfo(ep.name, dist_name, version, ep.value), f"import failed: {exc!r}")
                continue
            self._add(obj, ep.name, (dist_name, version))

    def _add(self, obj: Any, name: str, dist: tuple[str | None, str | None]) -> None:
        info = PluginInfo(name, dist[0], dist[1], getattr(obj, "__name__", type(obj).__name__))
        try:
            self._pm.register(obj, name=name)
        except Exception as exc:
            self._fail(info, f"invalid plugin: {exc}")
            return
        try:
            self._pm.check_pending()
        except Exception as exc:
            self._pm.unregister(name=name)
            self._fail(info, f"implements unknown hooks: {exc}")
            return
        self._infos[name] = info
        self._registries = None

    def _fail(self, info: PluginInfo, message: str) -> None:
        info.error = PluginError(info.name, _dist_label(info), message)
        self._infos[info.name] = info
        log.warning("%s", info.error)
        warnings.warn(str(info.error), PluginLoadWarning, stacklevel=3)

    def register(self, plugin: ModuleType | object, name: str | None = None) -> str:
        """Register a plugin object at run time (tests, applications); returns its name."""
        self._ensure_loaded()
        with self._lock:
            pname = name or getattr(plugin, "__name__", None) or f"plugin-{id(plugin)}"
            if pname in self._infos:
                raise UserError(f"a plugin named {pname!r} is already registered")
            self._add(plugin, pname, (None, None))
            info = self._infos[pname]
            if info.error is not None:
                del self._infos[pname]
                raise info.error
            return pname

    def unregister(self, name: str) -> None:
        """Remove a plugin registered under ``name`` (its registrations disappear)."""
        self._ensure_loaded()
        with self._lock:
            if name not in self._infos:
                raise UserError(f"no plugin named {name!r}; loaded: {', '.join(self._infos)}")
            if self._pm.get_plugin(name) is not None:
                self._pm.unregister(name=name)
            del self._infos[name]
            self._registries = None

    # -- registries ---------------------------------------------------------------------------

    def _build_registries(self) -> dict[str, Registry[Any]]:
        regs: dict[str, Registry[Any]] = {
            "stores": Registry("store backend"),
            "algorithms": Registry("algorithm"),
            "adapters": Registry("adapter"),
            "credit": Registry("credit assigner"),
            "advantage": Registry("advantage estimator"),
            "environments": Registry("environment kind"),
        }
        impls: dict[str, list[tuple[str, Any]]] = {}
        for hook_name, reg_name in _HOOKS.items():
            for impl in getattr(self._pm.hook, hook_name).get_hookimpls():
                impls.setdefault(impl.plugin_name, []).append((reg_name, impl))
        # Plugins in load order (built-ins first); a plugin's registrations land all or none.
        for info in self._infos.values():
            info.registered = {}
            if info.error is None:
                self._register_plugin(info, impls.get(info.name, []), regs)
        return regs

    def _register_plugin(self, info: PluginInfo, impls: list[tuple[str, Any]], regs: dict[str, Registry[Any]]) -> None:
        staged: list[tuple[str, Entry[Any]]] = []
        for reg_name, impl in impls:

            def register(name: str, implementation: Any, /, _reg: str = reg_name) -> None:
                if not isinstance(name, str) or not name:
                    raise TypeError(f"register() needs a non-empty name, got {name!r}")
                target = _credit_kind(implementation) if _reg == "credit" else _reg
                staged.append((target, Entry(name, implementation, info.name, _dist_label(info))))

            try:
                impl.function(**{arg: register for arg in impl.argnames})
            except Exception as exc:  # never let a plugin's hook raise into the host
                self._fail(info, f"{impl.function.__name__} raised {exc!r}")
                return
        for target, entry in staged:
            if entry.name in regs[target]:
                first = regs[target].entry(entry.name)
                self._fail(
                    info,
                    f"{regs[target].kind} {entry.name!r} is already registered by plugin "
                    f"{first.plugin!r}; that registration is kept and this plugin is disabled",
                )
                for t, e in staged:  # roll back what this plugin already added
                    regs[t].discard(e)
                info.registered = {}
                return
            regs[target].add(entry)
            info.registered.setdefault(target, []).append(entry.name)

    def _regs(self) -> dict[str, Registry[Any]]:
        self._ensure_loaded()
        with self._lock:
            if self._registries is None:
                self._registries = self._build_registries()
            return self._registries

    @property
    def stores(self) -> Registry[Callable[..., Any]]:
        """Store backend factories by URL scheme."""
        return self._regs()["stores"]

    @property
    def algorithms(self) -> Registry[Callable[..., Any]]:
        """Algorithm factories by name."""
        return self._regs()["algorithms"]

    @property
    def adapters(self) -> Registry[Callable[..., Any]]:
        """Framework adapter factories by name."""
        return self._regs()["adapters"]

    @property
    def credit_assigners(self) -> Registry[Any]:
        """Credit assigners by name."""
        return self._regs()["credit"]

    @property
    def advantage_estimators(self) -> Registry[Any]:
        """Advantage estimators by name."""
        return self._regs()["advantage"]

    @property
    def environments(self) -> Registry[Any]:
        """Kinds of environment an agent can be given as (verifiers environments, ...), by name."""
        return self._regs()["environments"]

    def infos(self) -> list[PluginInfo]:
        """Every plugin seen, loaded or failed, with what it registered."""
        self._regs()
        return list(self._infos.values())

    @property
    def errors(self) -> list[PluginError]:
        """The errors of plugins that failed; empty when all loaded."""
        return [i.error for i in self.infos() if i.error is not None]


def _dist_label(info: PluginInfo) -> str | None:
    if info.distribution is None:
        return None
    return f"{info.distribution} {info.version}" if info.version else info.distribution


def distribution_version(distribution: str) -> str:
    """The installed version of ``distribution`` (what a package's ``__version__`` says), or
    ``0.0.0+unknown`` when it runs from a source tree that is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0+unknown"


def lazy_factory(reference: str) -> Callable[[], Any]:
    """A factory that imports ``"package.module:name"`` when first called and returns
    ``name()``: how a plugin module registers an implementation without importing it (or the
    framework it wraps), e.g. ``register("langchain", lazy_factory("agentbolt_langchain.adapter:LangChainAdapter"))``."""
    module_name, _, attr = reference.partition(":")
    if not module_name or not attr:
        raise ValueError(f"reference must look like 'package.module:name', got {reference!r}")

    def make() -> Any:
        return getattr(importlib.import_module(module_name), attr)()

    return make


def _dist_of_module(module: str) -> tuple[str | None, str | None]:
    try:
        return module, importlib.metadata.version(module)
    except importlib.metadata.PackageNotFoundError:
        return module, None


@functools.cache
def default_plugins() -> Plugins:
    """The process-wide plugin manager, created (and loaded) on first use."""
    return Plugins()
