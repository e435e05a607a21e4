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
    assert cfg.algorithm.adv_estimator == "agentbolt"  # a sentinel: LightningRL computes advantages
    assert cfg.critic.enable is False
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "agentbolt"
    # LightningRL's default (per-rollout mean) for the policy gradient; verl's nearest for entropy/KL
    assert cfg.actor_rollout_ref.actor.loss_agg_mode == "seq-mean-token-mean"
    correction = cfg.algorithm.rollout_correction
    assert correction.rollout_is is None and correction.rollout_rs is None and correction.bypass_mode is False
    assert cfg.trainer.v1.sampler.max_off_policy_threshold is None
    assert cfg.actor_rollout_ref.rollout.name == "vllm"
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "agentbolt"
    assert cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path.endswith("binding/agent_loops.yaml")
    assert cfg.actor_rollout_ref.model.external_lib == "agentbolt_verl.registry"
    assert cfg.trainer.use_v1 is True and cfg.trainer.v1.trainer_mode == "agentbolt_sync"
    assert cfg.ray_kwargs.ray_init.runtime_env.worker_process_setup_hook == c.WORKER_SETUP_HOOK
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-0.5B-Instruct" and cfg.actor_rollout_ref.rollout.n == 4
    # our section, with LightningRL's length limits resolved from verl's rollout config
    settings = c.settings_from_verl_config(cfg)
    assert settings.lightningrl.max_prompt_length == cfg.actor_rollout_ref.rollout.prompt_length == 512
    assert settings.lightningrl.max_response_length == 512
    assert settings.async_.enabled is False


def test_off_policy_settings_map_to_verls_async_trainer_and_correction_keys() -> None:
    cfg = compose(
        agentbolt={
            "async": {"enabled": True, "warmup_batches": 2},
            "lightningrl": {
                "max_staleness": 1,
                "rollout_is": "token",
                "rollout_is_threshold": 3.0,
                "rollout_rs": "seq_sum_k1",
                "rollout_rs_threshold": "0.5_2.0",
                "loss_aggregation": "token-mean",
            },
        }
    )
    assert cfg.trainer.v1.trainer_mode == "agentbolt_colocate_async"
    assert cfg.trainer.v1.colocate_async.num_warmup_batches == 2
    # verl counts the versions a sample spans, the trained one included: K behind = K + 1
    assert cfg.trainer.v1.sampler.max_off_policy_threshold == 2
    assert cfg.trainer.v1.sampler.max_off_policy_strategy == "drop"
    correction = cfg.algorithm.rollout_correction
    assert (correction.rollout_is, correction.rollout_is_threshold) == ("token", 3.0)
    assert (correction.rollout_rs, correction.rollout_rs_threshold) == ("seq_sum_k1", "0.5_2.0")
    assert correction.bypass_mode is False  # the PPO ratio is against verl's recomputed old_log_probs
    assert cfg.actor_rollout_ref.actor.loss_agg_mode == "token-mean"
    assert cfg.agentbolt["async"] == {"enabled": True, "warmup_batches": 2.0}
    assert c.settings_from_verl_config(cfg).lightningrl.correction is not None
    # `async: true` is the short form; max_staleness 0 is on-policy only (threshold 1)
    short = compose(agentbolt={"async": True, "lightningrl": {"max_staleness": 0}})
    assert short.trainer.v1.trainer_mode == "agentbolt_colocate_async"
    assert short.trainer.v1.sampler.max_off_policy_threshold == 1


def test_kl_in_the_reward_is_refused() -> None:
    with pytest.raises(UserError, match="use_kl_loss"):
        compose(verl={"algorithm.use_kl_in_reward": True})


def test_correction_needs_verl_to_keep_the_sampling_logprobs() -> None:
    with pytest.raises(UserError, match="calculate_log_probs=true"):
        compose(
            agentbolt={"lightningrl": {"rollout_is": "sequence"}},
            verl={"actor_rollout_ref.rollout.calculate_log_probs": False},
        )


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
    lrl = as_dict.agentbolt.lightningrl
    assert lrl.max_prompt_length == 1024 and lrl.max_response_length == 256
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
        ({"bogus": 1}, "unknown key(s) 'bogus'; valid keys: store_url, lightningrl, async"),
        ({"batch": {"missing_reward": "zero"}}, "unknown key(s) 'batch'"),
        ({"singleton_groups": "raw"}, "unknown key(s) 'singleton_groups'"),
        ({"lightningrl": {"aggregaton": "token-mean"}}, "agentbolt.lightningrl.aggregaton: Extra inputs"),
        ({"lightningrl": {"loss_aggregation": "token"}}, "agentbolt.lightningrl.loss_aggregation: Input should be"),
        ({"lightningrl": {"rollout_rs": "seq_sum_k1"}}, "needs rollout_rs_threshold"),
        ({"rollout": {"max_attempts": 0}}, "agentbolt.rollout.max_attempts"),
        ({"rollout": {"fill_reward_from_rollout": True}}, "unknown key(s) 'fill_reward_from_rollout'"),
        ({"async": {"warmup_batches": 0}}, "agentbolt.async.warmup_batches"),
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
    with pytest.raises(UserError, match=r"rollout_correction\.rollout_is.*agentbolt section"):
        compose(verl={"algorithm.rollout_correction.rollout_is": "token"})
    with pytest.raises(UserError, match=r"max_off_policy_threshold.*agentbolt section"):
        compose(verl={"trainer.v1.sampler.max_off_policy_threshold": 4})
    with pytest.raises(UserError, match="worker_process_setup_hook"):
        compose(verl=["ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=x.y"])


@pytest.mark.parametrize(
    ("aggregation", "entropy_kl_mode"),
    [
        ("rollout-mean-token-mean", "seq-mean-token-mean"),
        ("token-mean", "token-mean"),
        ("seq-mean-token-mean", "seq-mean-token-mean"),
        ("seq-mean-token-sum", "seq-mean-token-sum"),
    ],
)
@pytest.mark.parametrize("advantage", ["grpo", "rloo", "reinforce_pp"])
def test_every_lightningrl_choice_runs_through_the_one_loss(aggregation, entropy_kl_mode, advantage) -> None:
    """No LightningRL choice changes verl's estimator or policy loss: LightningRL computes both columns."""
    cfg = compose(agentbolt={"lightningrl": {"advantage": advantage, "loss_aggregation": aggregation}})
    assert cfg.algorithm.adv_estimator == "agentbolt"
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "agentbolt"
    assert cfg.actor_rollout_ref.actor.loss_agg_mode == entropy_kl_mode


def test_response_limit_cannot_exceed_verls() -> None:
    with pytest.raises(UserError, match=r"exceeds actor_rollout_ref\.rollout\.response_length"):
        compose(agentbolt={"lightningrl": {"max_response_length": 4096}})


def test_load_config_from_yaml_file(tmp_path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text(
        "agentbolt:\n  store_url: sqlite:///x.db\n  lightningrl: {advantage: rloo}\n"
        "verl:\n  data.train_batch_size: 4\n  actor_rollout_ref:\n    rollout: {n: 2}\n"
    )
    cfg = c.compose_verl_config(path)
    assert cfg.data.train_batch_size == 4 and cfg.actor_rollout_ref.rollout.n == 2
    assert c.settings_from_verl_config(cfg).lightningrl.advantage == "rloo"
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
    assert cfg.agentbolt.lightningrl.max_prompt_length == 2048


def test_policies_by_role_are_refused_with_what_it_would_take() -> None:
    section = {"store_url": "sqlite:///x.db", "policies": {"writer": {"match": ["write_query"]}, "rewriter": {}}}
    with pytest.raises(UserError, match=r"trains one shared policy.*max_loras=1.*'Policies by role'.*torch-grpo"):
        c.load_config({"agentbolt": section})
    shared = c.load_config({"agentbolt": {"store_url": "sqlite:///x.db", "policies": {"everything": {}}}})
    assert shared.agentbolt.policies == {"everything": {}}  # one policy for every agent: what verl trains
