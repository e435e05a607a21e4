"""The package's shape as a user meets it: the top-level names, cheap imports, the subpackages'
exports, and the optional distributions (agentbolt-apo, agentbolt-dashboard) named when missing."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

import agentbolt
from agentbolt.cli import app
from agentbolt.errors import UserError
from agentbolt.plugins import Plugins


def test_top_level_names_are_the_user_api() -> None:
    from agentbolt.capture.emit import emit_reward, operation
    from agentbolt.capture.roles import AgentRoles
    from agentbolt.lightningrl.config import LightningRLConfig
    from agentbolt.plugins.hookspecs import hookimpl
    from agentbolt.store import open_store
    from agentbolt.trainer import Trainer
    from agentbolt.types import Resources, Task

    assert agentbolt.Trainer is Trainer and agentbolt.emit_reward is emit_reward and agentbolt.operation is operation
    assert agentbolt.LightningRLConfig is LightningRLConfig and agentbolt.AgentRoles is AgentRoles
    assert agentbolt.Task is Task and agentbolt.Resources is Resources and agentbolt.open_store is open_store
    assert agentbolt.hookimpl is hookimpl
    assert set(agentbolt.__all__) <= set(dir(agentbolt))
    for name in agentbolt.__all__:
        assert getattr(agentbolt, name) is not None


def test_import_agentbolt_is_cheap_and_names_load_on_first_use() -> None:
    code = (
        "import sys, agentbolt\n"
        "heavy = ('agentbolt.trainer', 'agentbolt.store', 'agentbolt.gateway', 'fastapi', 'opentelemetry.sdk')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "from agentbolt import emit_reward\n"
        "print('agentbolt.capture.emit' in sys.modules, 'agentbolt.trainer' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["[]", "True False"]


def test_subpackages_export_their_parts() -> None:
    from agentbolt import capture, runners, runs, store
    from agentbolt.capture.tracing import current_rollout
    from agentbolt.runners.pool import RunnerPool
    from agentbolt.runners.runner import RunnerConfig
    from agentbolt.runs.doctor import diagnose
    from agentbolt.store.run_records import RolloutSearch, RunSpec

    assert capture.current_rollout is current_rollout
    assert runners.RunnerConfig is RunnerConfig and runners.RunnerPool is RunnerPool
    assert runs.diagnose is diagnose
    assert store.RolloutSearch is RolloutSearch and store.RunSpec is RunSpec
    with pytest.raises(AttributeError, match=r"'agentbolt\.runners' has no attribute 'Nope'"):
        runners.Nope  # noqa: B018


def test_python_dash_m_runs_the_command_line() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "agentbolt.cli", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout == f"agentbolt {agentbolt.__version__}\n"


def test_the_dashboard_command_says_what_to_install_when_it_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "agentbolt_dashboard", None)  # import fails as if not installed
    result = CliRunner().invoke(app, ["dashboard", "--store", "memory://"])
    assert result.exit_code == 2
    assert result.output == "error: the dashboard is not installed: pip install agentbolt-dashboard\n"


def test_a_first_party_algorithm_that_is_not_installed_names_its_package() -> None:
    only_builtins = Plugins(load_entry_points=False)
    with pytest.raises(UserError, match=r"unknown algorithm 'apo'; .*pip install agentbolt-apo\)$"):
        only_builtins.algorithms.get("apo")
    with pytest.raises(UserError, match=r"^unknown algorithm 'mine'; valid names: \(none registered\)$"):
        only_builtins.algorithms.get("mine")
