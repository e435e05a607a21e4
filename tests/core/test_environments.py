"""An environment of another framework given as the agent: an object a registered environment
kind accepts, or "KIND://NAME", resolves to the agent that runs it (through the real plugin
manager), in load_agent and so in Trainer and `agentbolt runner`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agentbolt import hookimpl
from agentbolt import types as t
from agentbolt.environments import environment_agent, is_environment_reference
from agentbolt.errors import UserError
from agentbolt.plugins.registry import Plugins, default_plugins
from agentbolt.runners.runner import load_agent


class ToyEnv:
    def __init__(self, name: str) -> None:
        self.name = name


class ToyKind:
    def accepts(self, obj: Any) -> bool:
        return isinstance(obj, ToyEnv)

    def agent(self, env: Any) -> Any:
        env = env if isinstance(env, ToyEnv) else ToyEnv(env)

        def play(task: Any, resources: t.Resources) -> float:
            return float(task == env.name)

        return play


class ToyPlugin:
    @hookimpl
    def agentbolt_register_environments(self, register: Any) -> None:
        register("toy", ToyKind())


@pytest.fixture
def toy_kind() -> Iterator[None]:
    name = default_plugins().register(ToyPlugin(), name="toy-environments")
    try:
        yield
    finally:
        default_plugins().unregister(name)


def test_an_accepted_object_and_a_reference_resolve_to_the_kinds_agent(toy_kind: None) -> None:
    assert "toy" in default_plugins().environments
    by_object = load_agent(ToyEnv("a"))
    by_name = load_agent("toy://b")
    assert by_object("a", t.Resources()) == 1.0 and by_object("b", t.Resources()) == 0.0
    assert by_name("b", t.Resources()) == 1.0
    assert environment_agent(object()) is None  # no kind accepts it


def test_references_are_told_apart_from_module_references(toy_kind: None) -> None:
    assert is_environment_reference("toy://x") and not is_environment_reference("pkg.mod:agent")
    with pytest.raises(UserError, match=r"unknown environment kind 'nope'; valid names: .*toy"):
        load_agent("nope://x")
    with pytest.raises(UserError, match="names no environment"):
        load_agent("toy://")
    with pytest.raises(UserError, match="an agent must be a function"):
        load_agent(42)


def test_the_verifiers_kind_names_its_package_when_missing() -> None:
    builtins_only = Plugins(environ={"AGENTBOLT_PLUGINS": ""})  # as where agentbolt-verifiers is not installed
    with pytest.raises(UserError, match="pip install agentbolt-verifiers"):
        builtins_only.environments.get("verifiers")
