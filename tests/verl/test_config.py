"""The config surface: strict validation, composition with verl's Hydra config (no verl import)."""

from __future__ import annotations

import pytest

from agentbolt.errors import UserError
from agentbolt_verl import config as c

BASE = {"agentbolt": {"store_url": "sqlite:///runs.db"}}


def compose(agentbolt=None, verl=None, **kw):
    return c.compose_verl_config({"agentbolt": {**BASE["agentbolt"], **(agentbolt or {})}, "verl": verl or {}}, **kw)


def test_defaults_compose_with_verl_and_set_the_binding() -> None:
    cfg = compose(verl={"actor_rollout_ref": {"model.path": "Qwen/Qwen2.5-0.5B-Instruct", "rollout.n": 4}})
    assert cfg.algorithm.adv_estimator == "agentbolt_rollout_grpo"
    assert cfg.algorithm.norm_adv_by_std_in_grpo is True
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "agentbolt_rollout_mean"
    assert cfg.actor_rollout_ref.actor.loss_agg_mode == "token-mean"
    assert cfg.actor_rollout_ref.rollout.name == "vllm"
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "agentbolt"
    assert cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path.endswith("binding/agent_loops.yaml")
    assert cfg.actor_rollout_ref.model.external_lib == "agentbolt_verl.registry"
    assert cfg.trainer.use_v1 is True and cfg.trainer.v1.trainer_mode == "agentbolt_sync"
    assert cfg.ray_kwargs.ray_init.runtime_env.worker_process_setup_hook == c.WORKER_SETUP_HOOK
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-0.5B-Instruct" and cfg.actor_rollout_ref.rollout.n == 4
    # our section, with lengths resolved from verl's rollout config
    settings = c.settings_from_verl_config(cfg)
    assert settings.batch.max_prompt_length == cfg.actor_rollout_ref.rollout.prompt_length == 512
    assert settings.batch.max_response_length == 512


def test_valid_overrides_resolve_in_both_forms() -> None:
    as_dict = compose(
        verl={
            "data": {"max_prompt_length": 1024, "max_response_length": 256, "train_batch_size": 8},
            "trainer.logger": ["console"],
            "trainer.project_name": "it's: a test, with [brackets]",
            "actor_rollout_ref.rollout.temperature": 0.7,
            "trainer.total_training_steps": None,
        }
    )
    assert as_dict.actor_rollout_ref.rollout.prompt_length == 1024
    assert as_dict.agentbolt.batch.max_prompt_length == 1024 and as_dict.agentbolt.batch.max_response_length == 256
    assert list(as_dict.trainer.logger) == ["console"]
    assert as_dict.trainer.project_name == "it's: a test, with [brackets]"
    assert as_dict.actor_rollout_ref.rollout.temperature == 0.7
    as_list = compose(verl=["data.train_batch_size=8", "+trainer.my_extra=1"], extra=["trainer.nnodes=2"])
    assert as_list.data.train_batch_size == 8 and as_list.trainer.my_extra == 1 and as_list.trainer.nnodes == 2


def test_unknown_verl_key_is_rejected_with_valid_keys() -> None:
    with pytest.raises(UserError, match=r"trainer\.n_gpu_per_node") as err:
        compose(verl={"trainer.n_gpu_per_node": 1})
    assert "valid keys under trainer:" in str(err.value) and "n_gpus_per_node" in str(err.value)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"bogus": 1}, "unknown key(s) 'bogus'; valid keys: store_url, transitions"),
        ({"loss": {"aggregation": "token"}}, "unknown key(s) 'loss'"),
        ({"lightningrl": {"aggregaton": "token-mean"}}, "agentbolt.lightningrl.aggregaton: Extra inputs"),
        ({"lightningrl": {"loss_aggregation": "token"}}, "agentbolt.lightningrl.loss_aggregation: Input should be"),
        ({"lightningrl": {"advantage": "gae"}}, "lightningrl.advantage='gae' has no verl estimator"),
        ({"lightningrl": {"advantage_options": {"epsilon": 0.1}}}, "advantage_options epsilon cannot be passed"),
        ({"lightningrl": {"advantage_options": {"level": "transition"}}}, "needs advantage_options.level='rollout'"),
        ({"rollout": {"max_attempts": 0}}, "agentbolt.rollout.max_attempts"),
        (
            {
                "lightningrl": {
                    "loss_aggregation": "token-mean",
                    "advantage_options": {"level": "transition", "norm_std": False},
                }
            },
            "not honoured by verl's per-row GRPO",
        ),
    ],
)
def test_our_section_is_strict(section, message) -> None:
    with pytest.raises(UserError) as err:
        compose(agentbolt=section)
    assert message in str(err.value)


def test_top_level_is_strict() -> None:
    with pytest.raises(UserError, match=r"unknown key.*'trainer'.*valid keys: agentbolt, verl"):
        c.load_config({**BASE, "trainer": {}})


def test_keys_our_settings_decide_cannot_be_overridden() -> None:
    with pytest.raises(UserError, match=r"algorithm\.adv_estimator.*agentbolt section"):
        compose(verl={"algorithm.adv_estimator": "grpo"})
    with pytest.raises(UserError, match="worker_process_setup_hook"):
        compose(verl=["ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=x.y"])


@pytest.mark.parametrize(
    ("lightningrl", "estimator", "loss_mode", "agg"),
    [
        ({"loss_aggregation": "token-mean"}, "agentbolt_rollout_grpo", "vanilla", "token-mean"),
        (
            {"loss_aggregation": "seq-mean-token-mean", "advantage": "rloo"},
            "agentbolt_rollout_rloo",
            "vanilla",
            "seq-mean-token-mean",
        ),
        (
            {"loss_aggregation": "seq-mean-token-sum", "advantage": "reinforce_pp"},
            "agentbolt_rollout_reinforce_plus_plus_baseline",
            "vanilla",
            "seq-mean-token-sum",
        ),
        (
            {"loss_aggregation": "token-mean", "advantage_options": {"level": "transition"}},
            "grpo_vectorized",
            "vanilla",
            "token-mean",
        ),
        (
            {"loss_aggregation": "token-mean", "advantage": "rloo", "advantage_options": {"level": "transition"}},
            "rloo",
            "vanilla",
            "token-mean",
        ),
    ],
)
def test_settings_map_to_verl_keys(lightningrl, estimator, loss_mode, agg) -> None:
    cfg = compose(agentbolt={"lightningrl": lightningrl})
    assert cfg.algorithm.adv_estimator == estimator
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == loss_mode
    assert cfg.actor_rollout_ref.actor.loss_agg_mode == agg


def test_response_limit_cannot_exceed_verls() -> None:
    with pytest.raises(UserError, match=r"exceeds actor_rollout_ref\.rollout\.response_length"):
        compose(agentbolt={"batch": {"max_response_length": 4096}})


def test_load_config_from_yaml_file(tmp_path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text(
        "agentbolt:\n  store_url: sqlite:///x.db\n  lightningrl: {advantage: rloo}\n"
        "verl:\n  data.train_batch_size: 4\n  actor_rollout_ref:\n    rollout: {n: 2}\n"
    )
    cfg = c.compose_verl_config(path)
    assert cfg.data.train_batch_size == 4 and cfg.actor_rollout_ref.rollout.n == 2
    assert cfg.algorithm.adv_estimator == "agentbolt_rollout_rloo"
    with pytest.raises(UserError, match="does not exist"):
        c.load_config(tmp_path / "missing.yaml")


def test_format_override() -> None:
    assert c.format_override("a.b", None) == "a.b=null"
    assert c.format_override("a", True) == "a=true"
    assert c.format_override("a", [1, "x", {"k": 2.5}]) == "a=[1,'x',{k:2.5}]"
    assert c.format_override("a", "it's") == "a='it\\'s'"


def test_shipped_example_config_composes(monkeypatch) -> None:
    from pathlib import Path

    import agentbolt_verl

    monkeypatch.delenv("AGENTBOLT_GATEWAY_CONTROL", raising=False)
    monkeypatch.setenv("AGENTBOLT_GATEWAY_URL", "http://10.1.2.3:8100/v1")
    example = Path(agentbolt_verl.__file__).parents[2] / "examples" / "qwen2.5-0.5b-1gpu.yaml"
    cfg = c.compose_verl_config(example, extra=["trainer.total_training_steps=2", "trainer.default_local_dir=/tmp/x"])
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert cfg.trainer.n_gpus_per_node == 1 and cfg.trainer.total_training_steps == 2
    assert cfg.actor_rollout_ref.rollout.n == 4 and cfg.actor_rollout_ref.rollout.prompt_length == 2048
    assert (
        cfg.agentbolt.gateway.url == "http://10.1.2.3:8100/v1"
        and cfg.agentbolt.gateway.control == "agentbolt.gateway:GatewayClient"
    )
    assert cfg.agentbolt.batch.max_prompt_length == 2048
