"""agentbolt_torch's layers hold with every import counted, ``if TYPE_CHECKING:`` ones included.

``lint-imports`` checks the root pyproject's ``agentbolt-torch ...`` contracts on the imports that
run (the workspace excludes the type-checking ones); a back-reference kept only for annotations
still ties two modules into one, so these tests read the same contracts and check them on the
full graph, and check that no module of the package reaches itself through others.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "agentbolt_torch"


def _contracts() -> list[dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    return [c for c in config if c["name"].startswith("agentbolt-torch")]


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(PACKAGE, exclude_type_checking_imports=False, cache_dir=None)


def _layers(contract: dict[str, Any]) -> list[grimp.Layer]:
    return [grimp.Layer(*(part.strip() for part in layer.split("|"))) for layer in contract["layers"]]


def test_the_package_has_its_contracts_and_they_cover_every_module(graph: grimp.ImportGraph) -> None:
    contracts = {c["name"]: c for c in _contracts()}
    assert set(contracts) >= {
        "agentbolt-torch layers",
        "agentbolt-torch generation layers",
        "agentbolt-torch serving layers",
        "agentbolt-torch update layers",
        "agentbolt-torch training layers",
    }
    covered: set[str] = set()
    for contract in contracts.values():
        (container,) = contract["containers"]
        for layer in contract["layers"]:
            covered |= {f"{container}.{part.strip()}" for part in layer.split("|")}
    modules = {m for m in graph.modules if m.startswith(PACKAGE + ".")}
    # a new module must be placed in its container's layers
    assert modules <= covered, f"modules of agentbolt_torch outside the layers: {sorted(modules - covered)}"


@pytest.mark.parametrize("name", [c["name"] for c in _contracts()])
def test_each_contract_holds_with_type_checking_imports(graph: grimp.ImportGraph, name: str) -> None:
    (contract,) = [c for c in _contracts() if c["name"] == name]
    illegal = graph.find_illegal_dependencies_for_layers(
        layers=_layers(contract), containers=set(contract["containers"])
    )
    found = [
        f"{dep.importer} -> {dep.imported}: " + "; ".join(" -> ".join(route.heads) for route in dep.routes)
        for dep in illegal
    ]
    assert not found, "\n".join(found)


def test_no_module_imports_itself_back(graph: grimp.ImportGraph) -> None:
    modules = sorted(m for m in graph.modules if m == PACKAGE or m.startswith(PACKAGE + "."))
    edges = {m: {d for d in graph.find_modules_directly_imported_by(m) if d.startswith(PACKAGE + ".")} for m in modules}
    # Tarjan's strongly connected components: any component with more than one module is a circle
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(m: str) -> None:
        index[m] = low[m] = len(index)
        stack.append(m)
        on_stack.add(m)
        for d in edges.get(m, ()):
            if d not in index:
                visit(d)
                low[m] = min(low[m], low[d])
            elif d in on_stack:
                low[m] = min(low[m], index[d])
        if low[m] == index[m]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == m:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for m in modules:
        if m not in index:
            visit(m)
    assert not circles, f"import circles in agentbolt_torch: {circles}"


def test_a_back_reference_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: a package whose two modules import each other, one only for
    annotations, has a circle."""
    package = tmp_path / "circular_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    full = grimp.build_graph("circular_pkg", exclude_type_checking_imports=False, cache_dir=None)
    runtime = grimp.build_graph("circular_pkg", exclude_type_checking_imports=True, cache_dir=None)
    assert full.direct_import_exists(importer="circular_pkg.b", imported="circular_pkg.a")
    assert not runtime.direct_import_exists(importer="circular_pkg.b", imported="circular_pkg.a")
    layers = [grimp.Layer("a"), grimp.Layer("b")]
    assert full.find_illegal_dependencies_for_layers(layers=layers, containers={"circular_pkg"})
