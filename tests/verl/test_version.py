"""The exact-version guard and the cheap, verl-free package import."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import textwrap
import types

import pytest

from agentbolt.errors import MissingDependencyError
from agentbolt_verl import _verl


@pytest.fixture
def fresh_guard(monkeypatch):
    monkeypatch.setattr(_verl, "_installed", None)
    return monkeypatch


def test_pinned_version_is_installed() -> None:
    assert _verl.REQUIRED_VERL_VERSION == "0.9.1"
    assert _verl.check_verl_version() == "0.9.1"


def test_other_version_fails_naming_both(fresh_guard) -> None:
    fresh_guard.setattr(_verl.importlib.metadata, "version", lambda name: "0.9.0")
    with pytest.raises(_verl.VerlVersionError) as err:
        _verl.import_verl("verl.trainer.ppo.core_algos")
    message = str(err.value)
    assert "verl==0.9.1" in message and "verl 0.9.0 is installed" in message
    assert "pip install 'verl==0.9.1'" in message
    assert isinstance(err.value, ImportError) and err.value.installed == "0.9.0"


def test_missing_verl_names_the_package(fresh_guard) -> None:
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    fresh_guard.setattr(_verl.importlib.metadata, "version", missing)
    with pytest.raises(MissingDependencyError, match=r"pip install 'verl==0\.9\.1'"):
        _verl.check_verl_version()


def test_imported_verl_version_is_checked_too(fresh_guard) -> None:
    module = sys.modules.get("verl") or types.ModuleType("verl")
    fresh_guard.setitem(sys.modules, "verl", module)
    fresh_guard.setattr(module, "__version__", "0.8.0", raising=False)
    with pytest.raises(_verl.VerlVersionError, match=r"verl 0.8.0 is installed \(verl.__version__"):
        _verl.check_verl_version()


def test_import_verl_only_imports_verl() -> None:
    with pytest.raises(ValueError, match="verl modules only"):
        _verl.import_verl("os")


def test_package_imports_cheaply_without_verl() -> None:
    """`import agentbolt_verl` and the verl-free layers work when verl cannot be imported."""
    code = textwrap.dedent(
        """
        import importlib.abc, sys
        from importlib.machinery import ModuleSpec, PathFinder

        class BlockLoader(importlib.abc.Loader):
            def create_module(self, spec):
                return None

            def exec_module(self, module):
                raise ImportError("verl blocked for this test")

        class Block(importlib.abc.MetaPathFinder):
            # verl can be found (its YAML read) but not imported
            def find_spec(self, name, path=None, target=None):
                if name != "verl" and not name.startswith("verl."):
                    return None
                real = PathFinder.find_spec(name, path)
                if real is None:
                    return None
                spec = ModuleSpec(name, BlockLoader(), origin=real.origin, is_package=bool(real.submodule_search_locations))
                if real.submodule_search_locations:
                    spec.submodule_search_locations = list(real.submodule_search_locations)
                return spec

        sys.meta_path.insert(0, Block())
        import agentbolt_verl
        assert "torch" not in sys.modules, "import agentbolt_verl pulled torch"
        import agentbolt_verl.batch, agentbolt_verl.config
        import agentbolt_verl.binding.gateway, agentbolt_verl.binding.rollouts, agentbolt_verl.binding.coordinator
        import agentbolt_verl.columns
        cfg = agentbolt_verl.config.compose_verl_config({"agentbolt": {"store_url": "memory://"}})
        assert cfg.trainer.v1.trainer_mode == "agentbolt_sync"
        try:
            import agentbolt_verl.losses
        except ImportError as exc:
            assert "blocked" in str(exc)
        else:
            raise AssertionError("verl was imported")
        assert not any(m == "verl" or m.startswith("verl.") for m in sys.modules)
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
