"""The one gate every ``import verl`` goes through: verl is pinned to exactly one version.

verl renames or moves the classes an external-rollout integration touches in almost every
minor release (see the package README), so agentbolt-verl supports exactly
:data:`REQUIRED_VERL_VERSION` and refuses anything else with an error naming both versions.
The check reads the installed distribution's metadata first (cheap: verl itself is not
imported), then, once verl is imported, ``verl.__version__``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from types import ModuleType

from agentbolt.errors import MissingDependencyError, UserError

__all__ = ["REQUIRED_VERL_VERSION", "VerlVersionError", "check_verl_version", "import_verl"]

REQUIRED_VERL_VERSION = "0.9.1"
"""The only verl version agentbolt-verl runs with."""

_INSTALL = f"pip install 'verl=={REQUIRED_VERL_VERSION}'"
_installed: str | None = None


class VerlVersionError(UserError, ImportError):
    """The installed verl is not the pinned version."""

    def __init__(self, installed: str, where: str) -> None:
        super().__init__(
            f"agentbolt-verl requires verl=={REQUIRED_VERL_VERSION} exactly, but verl {installed} is installed "
            f"({where}). verl changes the APIs this binding uses between releases; install the pinned "
            f"version with: {_INSTALL}"
        )
        self.installed = installed
        self.required = REQUIRED_VERL_VERSION


def check_verl_version() -> str:
    """Return the installed verl version if it is :data:`REQUIRED_VERL_VERSION`; raise otherwise.

    Raises:
        MissingDependencyError: verl is not installed.
        VerlVersionError: another verl version is installed.
    """
    global _installed
    if _installed is None:
        try:
            installed = importlib.metadata.version("verl")
        except importlib.metadata.PackageNotFoundError:
            raise MissingDependencyError("verl", f"'verl=={REQUIRED_VERL_VERSION}'", "agentbolt-verl") from None
        if installed != REQUIRED_VERL_VERSION:
            raise VerlVersionError(installed, "distribution metadata")
        _installed = installed
    module = sys.modules.get("verl")
    imported = getattr(module, "__version__", None) if module is not None else None
    if imported is not None and imported != REQUIRED_VERL_VERSION:
        raise VerlVersionError(imported, f"verl.__version__ of {getattr(module, '__file__', '?')}")
    return _installed


def import_verl(name: str = "verl") -> ModuleType:
    """Import ``name`` (a verl module) after checking the installed version."""
    if name != "verl" and not name.startswith("verl."):
        raise ValueError(f"import_verl imports verl modules only, got {name!r}")
    check_verl_version()
    module = importlib.import_module(name)
    check_verl_version()  # verl.__version__ is known now
    return module
