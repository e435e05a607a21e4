"""The plugin manager, with real entry points of temporary distributions on sys.path."""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentbolt import hookimpl
from agentbolt.cli import app
from agentbolt.errors import PluginError, UserError
from agentbolt.plugins import PluginLoadWarning, Plugins, default_plugins, lazy_factory
from agentbolt.store import open_store
from agentbolt.store.memory import MemoryStore


def make_distribution(
    site: Path, dist: str, version: str, module: str, source: str, ep_name: str | None = None
) -> None:
    """A minimal installed distribution: a module plus a dist-info with an entry point."""
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[agentbolt.plugins]\n{ep_name or module} = {module}\n")


GOOD = """
    from agentbolt import hookimpl
    from agentbolt.store.memory import MemoryStore

    class FakeStore(MemoryStore):
        pass

    def make(url, **options):
        return FakeStore(url, **options)

    class Booster:
        registry_kind = "advantage"

    @hookimpl
    def agentbolt_register_stores(register):
        register("fake", make)

    @hookimpl
    def agentbolt_register_credit(register):
        register("booster", Booster())
"""


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv("AGENTBOLT_PLUGINS", raising=False)
    importlib.invalidate_caches()
    yield site
    for name in [m for m in sys.modules if m.startswith("abtest_")]:
        del sys.modules[name]
    default_plugins.cache_clear()


def test_builtins_register_through_the_hooks() -> None:
    plugins = Plugins(load_entry_points=False)
    assert {"memory", "sqlite", "postgresql", "http", "https"} <= set(plugins.stores.names())
    store, lightningrl = plugins.infos()  # each part of core registers its own built-ins
    assert (store.name, lightningrl.name) == ("agentbolt.store", "agentbolt.lightningrl")
    assert store.distribution == lightningrl.distribution == "agentbolt" and store.ok and lightningrl.ok
    assert store.registered["stores"][:3] == ["memory", "sqlite", "postgresql"]
    assert {"final", "air", "grpo", "rloo"} <= {*lightningrl.registered["credit"], *lightningrl.registered["advantage"]}


def test_third_party_plugin_through_a_real_entry_point(site: Path) -> None:
    make_distribution(site, "abtest-good", "1.2.3", "abtest_good", GOOD)
    plugins = Plugins()
    assert "abtest_good" not in sys.modules  # lazy: nothing imported until a registry is used
    store = open_store("fake://anything", plugins=plugins)
    assert type(store).__name__ == "FakeStore" and isinstance(store, MemoryStore)
    assert "booster" in plugins.advantage_estimators and "booster" not in plugins.credit_assigners
    info = next(i for i in plugins.infos() if i.name == "abtest_good")
    assert (info.distribution, info.version, info.ok) == ("abtest-good", "1.2.3", True)
    assert info.registered == {"stores": ["fake"], "advantage": ["booster"]}


def test_broken_plugin_is_isolated(site: Path) -> None:
    make_distribution(site, "abtest-good", "1.0", "abtest_good", GOOD)
    make_distribution(site, "abtest-broken", "0.9", "abtest_broken", "import does_not_exist_anywhere\n")
    plugins = Plugins()
    with pytest.warns(PluginLoadWarning, match="abtest-broken 0.9"):
        stores = plugins.stores  # loading is lazy: it happens here
    assert "fake" in stores  # the good one still loads
    (error,) = plugins.errors
    assert isinstance(error, PluginError)
    assert error.distribution == "abtest-broken 0.9" and "does_not_exist_anywhere" in str(error)


def test_misspelt_hook_is_caught_by_check_pending(site: Path) -> None:
    source = """
        from agentbolt import hookimpl

        @hookimpl
        def agentbolt_register_storez(register):
            register("typo", object)
    """
    make_distribution(site, "abtest-typo", "0.1", "abtest_typo", source)
    plugins = Plugins()
    with pytest.warns(PluginLoadWarning, match="unknown hook"):
        stores = plugins.stores
    assert "typo" not in stores
    assert plugins.errors[0].plugin == "abtest_typo"
    assert "typo" not in plugins.stores


def test_a_raising_hook_drops_all_of_that_plugins_registrations(site: Path) -> None:
    source = """
        from agentbolt import hookimpl

        @hookimpl
        def agentbolt_register_stores(register):
            register("half", object)

        @hookimpl
        def agentbolt_register_algorithms(register):
            raise RuntimeError("no GPU here")
    """
    make_distribution(site, "abtest-raises", "0.1", "abtest_raises", source)
    plugins = Plugins()
    with pytest.warns(PluginLoadWarning, match="no GPU here"):
        stores = plugins.stores
    assert "half" not in stores
    assert "sqlite" in stores


def test_duplicate_names_keep_the_first(site: Path) -> None:
    source = """
        from agentbolt import hookimpl

        @hookimpl
        def agentbolt_register_stores(register):
            register("sqlite", object)
    """
    make_distribution(site, "abtest-dup", "0.1", "abtest_dup", source)
    plugins = Plugins()
    with pytest.warns(PluginLoadWarning, match="already registered by plugin 'agentbolt.store'"):
        stores = plugins.stores
    assert stores.entry("sqlite").plugin == "agentbolt.store"


@pytest.mark.parametrize(
    ("env", "loaded"),
    [
        ("", set()),
        ("abtest-good", {"abtest_good"}),  # by distribution name
        ("abtest_good2", {"abtest_good2"}),  # by entry-point name
        ("abtest-good, abtest-good2", {"abtest_good", "abtest_good2"}),
    ],
)
def test_env_var_restricts_loading(site: Path, env: str, loaded: set[str]) -> None:
    make_distribution(site, "abtest-good", "1.0", "abtest_good", GOOD)
    make_distribution(
        site, "abtest-good2", "1.0", "abtest_good2", GOOD.replace('"fake"', '"fake2"').replace('"booster"', '"b2"')
    )
    plugins = Plugins(environ={"AGENTBOLT_PLUGINS": env})
    names = {i.name for i in plugins.infos() if i.distribution != "agentbolt"} - {"torch"}
    assert names == loaded
    assert "sqlite" in plugins.stores  # built-ins always load


def test_registry_errors_list_valid_names() -> None:
    plugins = Plugins(load_entry_points=False)
    with pytest.raises(UserError, match="valid names: http, https, memory, postgresql, sqlite"):
        plugins.stores.get("mongodb")
    with pytest.raises(UserError, match="unknown store backend 'redis'"):
        open_store("redis://localhost", plugins=plugins)
    with pytest.raises(UserError, match="store URL must look like"):
        open_store("runs.db", plugins=plugins)


class _RuntimePlugin:
    @hookimpl
    def agentbolt_register_algorithms(self, register):  # type: ignore[no-untyped-def]
        register("noop", dict)


def test_register_and_unregister_at_runtime() -> None:
    plugins = Plugins(load_entry_points=False)
    name = plugins.register(_RuntimePlugin(), name="runtime")
    assert plugins.algorithms.get("noop") is dict
    with pytest.raises(UserError, match="already registered"):
        plugins.register(_RuntimePlugin(), name="runtime")
    plugins.unregister(name)
    assert "noop" not in plugins.algorithms
    with pytest.raises(UserError):
        plugins.unregister("runtime")


def test_cli_version_and_plugins(site: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("agentbolt ")
    make_distribution(site, "abtest-good", "1.2.3", "abtest_good", GOOD)
    default_plugins.cache_clear()
    result = runner.invoke(app, ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert rows["abtest_good"]["distribution"] == "abtest-good" and rows["abtest_good"]["version"] == "1.2.3"
    assert rows["abtest_good"]["registered"]["stores"] == ["fake"]
    assert rows["agentbolt.store"]["registered"]["stores"][0] == "memory"
    table = runner.invoke(app, ["plugins"])
    assert table.exit_code == 0 and "abtest-good" in table.output


def test_cli_plugins_reports_failures(site: Path) -> None:
    make_distribution(site, "abtest-broken", "0.9", "abtest_broken", "raise ImportError('needs torch')\n")
    default_plugins.cache_clear()
    with pytest.warns(PluginLoadWarning):
        result = CliRunner().invoke(app, ["plugins"])
    assert result.exit_code == 1
    assert "failed" in result.output and "needs torch" in result.output


def test_lazy_factory_imports_only_when_called() -> None:
    sys.modules.pop("json.tool", None)
    lazy_factory("json.tool:main")
    assert "json.tool" not in sys.modules  # registering imports nothing
    decoder = lazy_factory("json:JSONDecoder")()  # calling imports and builds
    assert decoder.decode("[1]") == [1]
    with pytest.raises(ValueError, match=r"must look like 'package\.module:name'"):
        lazy_factory("json.JSONDecoder")
