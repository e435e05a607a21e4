"""The option groups Trainer and the CLI share: defaults, mappings, clear errors, one path."""

from __future__ import annotations

import inspect
import re

import pytest
from typer.testing import CliRunner

from agentbolt.capture.roles import AgentRoles
from agentbolt.cli import app
from agentbolt.errors import UserError
from agentbolt.gateway import Upstream
from agentbolt.options import CaptureOptions, GatewayOptions, RunnerOptions
from agentbolt.runners.ray import RayWorkerOptions
from agentbolt.runners.runner import RunnerConfig
from agentbolt.trainer import Trainer


def agent(task: object, resources: object) -> float:
    return 1.0


def test_trainer_takes_at_most_twelve_parameters() -> None:
    params = [p for p in inspect.signature(Trainer.__init__).parameters if p != "self"]
    assert len(params) <= 12, params


def test_defaults_are_the_trainers_and_the_runners() -> None:
    runners, gateway, capture = RunnerOptions(), GatewayOptions(), CaptureOptions()
    assert (runners.n, runners.concurrency, runners.max_attempts, runners.timeout_s) == (1, 8, 3, None)
    assert (runners.lease_s, runners.restarts, runners.kind) == (30.0, 10, "processes")
    assert (runners.concurrency, runners.lease_s) == (RunnerConfig().concurrency, RunnerConfig().lease_s)
    assert runners.ray_options == RayWorkerOptions()
    assert (gateway.upstreams, gateway.host, gateway.port, gateway.token, gateway.upstream_timeout_s) == (
        (),
        "127.0.0.1",
        0,
        None,
        600.0,
    )
    assert (capture.token_ids, capture.tokenizer, capture.agent_names, capture.adapters) == ("exact", None, None, None)


def test_a_mapping_works_wherever_an_options_object_does() -> None:
    trainer = Trainer(
        agent,
        store="memory://",
        runners={"n": 0, "concurrency": 3, "lease_s": 5.0},
        gateway={"upstreams": "http://127.0.0.1:9/v1", "upstream_timeout_s": 7},
        capture={"agent_names": {"planner": "You plan"}, "adapters": []},
        progress=False,
    )
    assert trainer.runners == RunnerOptions(n=0, concurrency=3, lease_s=5.0)
    assert trainer.gateway.upstreams == ("http://127.0.0.1:9/v1",) and trainer.gateway.upstream_timeout_s == 7.0
    assert trainer.runner_config.concurrency == 3 and trainer.runner_config.adapters == []
    namer = trainer.capture.agent_names
    assert isinstance(namer, AgentRoles)
    assert namer({"messages": [{"role": "system", "content": "You plan the work."}]}) == "planner"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"runners": 2}, r"runners= takes RunnerOptions\(...\) or a mapping of its fields \(n, concurrency, .*got int"),
        ({"runners": {"n_runners": 2}}, r"invalid RunnerOptions:\n  n_runners: unknown option; valid: n, concurrency"),
        (
            {"runners": {"concurrency": "many"}},
            r"invalid RunnerOptions:\n  concurrency: Input should be a valid integer",
        ),
        ({"runners": {"n": -1}}, r"n: Input should be greater than or equal to 0"),
        ({"runners": {"kind": "ray", "n": 0}}, r"kind='ray' needs n >= 1"),
        ({"runners": {"ray_options": {"cpus": 1}}}, r"unknown Ray worker option\(s\) \['cpus'\]"),
        (
            {"gateway": {"upstream_timeout_s": float("inf")}},
            r"upstream_timeout_s: must be a positive number of seconds",
        ),
        ({"gateway": {"port": 70000}}, r"port: Input should be less than or equal to 65535"),
        ({"capture": {"token_ids": "retokenize"}}, r"needs the policy's tokenizer"),
        ({"capture": {"agent_names": 3}}, r"agent_names takes AgentRoles, a mapping"),
        ({"capture": CaptureOptions}, r"capture= takes CaptureOptions\(...\) .*got ModelMetaclass"),
    ],
)
def test_a_wrong_option_is_a_user_error_naming_it(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(UserError, match=message):
        Trainer(agent, store="memory://", progress=False, **kwargs)  # type: ignore[arg-type]


def test_runner_processes_need_a_store_url() -> None:
    with pytest.raises(UserError, match=re.escape("use sqlite:///path.db, or runners=RunnerOptions(n=0)")):
        Trainer(agent, store="memory://")
    Trainer(agent, store="memory://", runners=RunnerOptions(n=0))  # one runner in this process: fine


def test_gateway_options_take_one_upstream_or_several() -> None:
    one = GatewayOptions(upstreams="http://a:1/v1")
    several = GatewayOptions(upstreams=["http://a:1/v1", Upstream(base_url="http://b:2/v1", api_key="k")])
    assert one.upstreams == ("http://a:1/v1",)
    assert several.upstreams[1] == Upstream(base_url="http://b:2/v1", api_key="k")


def test_agent_roles_from_the_clis_specs() -> None:
    roles = AgentRoles.from_specs(["planner=You are the planner", r"solver=re:^You solve\b"])
    assert roles is not None and roles.system_prompt["planner"] == "You are the planner"
    assert roles({"messages": [{"role": "system", "content": "You solve it"}]}) == "solver"
    assert AgentRoles.from_specs([]) is None
    with pytest.raises(UserError, match=r"NAME=TEXT or NAME=re:PATTERN, got 'planner'"):
        AgentRoles.from_specs(["planner"])
    with pytest.raises(UserError, match=r"agent 'solver': '\(' is not a regular expression"):
        AgentRoles.from_specs(["solver=re:("])


def test_the_cli_validates_through_the_same_options() -> None:
    bad_name = CliRunner().invoke(app, ["gateway", "serve", "--store", "memory://", "--agent-name", "planner"])
    assert bad_name.exit_code == 2
    assert "error: an agent-name rule is NAME=TEXT or NAME=re:PATTERN, got 'planner'" in bad_name.output
    bad_port = CliRunner().invoke(app, ["gateway", "serve", "--store", "memory://", "--port", "70000"])
    assert bad_port.exit_code == 2 and "invalid GatewayOptions:\n  port:" in bad_port.output
    ray_without_workers = CliRunner().invoke(
        app, ["runner", "mod:agent", "--store", "sqlite:///x.db", "--ray", "local", "-n", "0"]
    )
    assert ray_without_workers.exit_code == 2 and "kind='ray' needs n >= 1" in ray_without_workers.output
