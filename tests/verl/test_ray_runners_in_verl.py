"""``agentbolt.runners.ray``: the binding starts its runner fleet as Ray actors in the Ray
cluster verl runs in (here a real local cluster of 2 CPUs on 127.0.0.1 stands in for verl's)."""

from __future__ import annotations

import os

import pytest
from test_binding import FakeVerlTrainer

from agentbolt.errors import UserError
from agentbolt.types import RolloutSpec, RolloutStatus
from agentbolt_verl.binding import coordinator as coord
from agentbolt_verl.config import compose_verl_config, load_config

# Under `uv run`, Ray would start its workers with `uv run` again; read when Ray is first imported.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
ray = pytest.importorskip("ray")


class Trainer(coord.AgentboltTrainerMixin, FakeVerlTrainer):
    pass


def config(store_url: str, **runners):
    return compose_verl_config(
        {
            "agentbolt": {
                "store_url": store_url,
                "gateway": {"url": "http://gw:8100/v1", "control": "verl_helpers:make_fake_gateway"},
                "runners": runners,
            },
            "verl": {},
        }
    )


def test_runners_start_and_stop_with_verls_trainer_in_its_ray_cluster(tmp_path) -> None:
    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1")
    try:
        cfg = config(
            f"sqlite:///{tmp_path}/runs.db",
            ray=True,
            agent="verl_ray_agents:task_reward_agent",
            workers=1,
            num_cpus=0.5,
            lease_s=5.0,
        )
        trainer = Trainer(cfg)
        trainer.on_init_end()  # verl's weights are up: the binding starts its runner actors
        assert trainer._agentbolt_runners is not None and len(trainer._agentbolt_runners.actors) == 1
        store = trainer._agentbolt_get_coordinator().store
        trainer._agentbolt_run(store.enqueue([RolloutSpec(rollout_id=f"r{i}", input={"reward": i}) for i in range(4)]))
        rollouts = trainer._agentbolt_run(store.wait_for_rollouts([f"r{i}" for i in range(4)], timeout=120))
        assert [r.status for r in rollouts] == [RolloutStatus.SUCCEEDED] * 4
        assert [r.final_reward for r in rollouts] == [0.0, 1.0, 2.0, 3.0]
        attempts = trainer._agentbolt_run(store.get_attempts("r0"))
        assert attempts[0].worker_id.startswith("verl-runner-0-")  # ran in an actor of this cluster
        trainer.on_train_end()
        assert trainer._agentbolt_runners is None
        assert ray.is_initialized()  # verl's cluster is left to verl
    finally:
        ray.shutdown()


def test_runner_settings_are_checked() -> None:
    with pytest.raises(UserError, match=r"runners.agent"):
        load_config({"agentbolt": {"store_url": "sqlite:///x.db", "runners": {"ray": True}}})
    with pytest.raises(UserError, match="workers"):
        load_config({"agentbolt": {"store_url": "sqlite:///x.db", "runners": {"workers": 0}}})
    off = load_config({"agentbolt": {"store_url": "sqlite:///x.db"}})
    assert off.agentbolt.runners.ray is False  # default: runners run apart, as before
