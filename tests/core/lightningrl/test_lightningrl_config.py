"""LightningRLConfig: one validated object for every transitions → loss choice."""

from __future__ import annotations

import json

import pydantic
import pytest

from agentbolt.errors import UserError
from agentbolt.lightningrl import FinalCredit, LightningRL, LightningRLConfig


def test_defaults_are_the_papers_choices() -> None:
    cfg = LightningRLConfig()
    assert (cfg.credit, cfg.advantage, cfg.agent_match, cfg.missing_reward) == ("final", "grpo", None, "drop")
    assert cfg.loss_aggregation == "rollout-mean-token-mean"


def test_from_mapping_with_overrides_and_replace() -> None:
    cfg = LightningRLConfig.from_value({"credit": "discounted", "credit_options": {"gamma": 0.9}}, merge=True)
    assert cfg.credit == "discounted" and cfg.credit_options == {"gamma": 0.9} and cfg.merge
    again = cfg.replace(loss_aggregation="seq-mean-token-sum")
    assert again.loss_aggregation == "seq-mean-token-sum" and again.credit_options == {"gamma": 0.9}
    assert cfg.loss_aggregation == "rollout-mean-token-mean", "replace makes a copy"
    assert LightningRLConfig.from_value(cfg) is cfg
    with pytest.raises(pydantic.ValidationError):
        cfg.merge = False  # type: ignore[misc]


def test_errors_name_the_field_and_the_valid_choices() -> None:
    with pytest.raises(UserError, match=r"aggregaton: unknown field; valid fields: credit, credit_options"):
        LightningRLConfig.from_value({"aggregaton": "token-mean"})
    with pytest.raises(UserError, match="loss_aggregation: Input should be 'rollout-mean-token-mean'"):
        LightningRLConfig.from_value(loss_aggregation="rollout-mean")
    with pytest.raises(UserError, match="fill_value"):
        LightningRLConfig.from_value(missing_reward="fill")
    with pytest.raises(UserError, match="regular expression"):
        LightningRLConfig.from_value(agent_match="(")
    with pytest.raises(UserError, match="credit_options apply to a credit assigner given by name"):
        LightningRLConfig.from_value(credit=FinalCredit(), credit_options={"gamma": 1.0})
    with pytest.raises(UserError, match="expected a LightningRLConfig"):
        LightningRLConfig.from_value(3)  # type: ignore[arg-type]


def test_lightningrl_is_built_from_the_config_or_keywords_that_build_it() -> None:
    cfg = LightningRLConfig(credit="discounted", credit_options={"gamma": 0.5}, agent_match=["a", "b"])
    assert cfg.agent_match == ("a", "b")
    lrl = LightningRL(cfg)
    assert lrl.config is cfg and lrl.credit.gamma == 0.5  # type: ignore[attr-defined]
    same = LightningRL(credit="discounted", credit_options={"gamma": 0.5}, agent_match=["a", "b"])
    assert same.config == cfg
    assert LightningRL(cfg, merge=True).config == cfg.replace(merge=True)
    with pytest.raises(UserError, match="unknown field"):
        LightningRL(loss_agg="token-mean")


def test_as_record_is_json_and_round_trips_names() -> None:
    cfg = LightningRLConfig(agent_match=["solver"], credit=FinalCredit())
    record = cfg.as_record()
    json.dumps(record)
    assert record["agent_match"] == ["solver"] and record["credit"].startswith("FinalCredit")
    by_name = LightningRLConfig(agent_match="^solver$", advantage_options={"level": "transition"})
    assert LightningRLConfig.from_value(by_name.as_record()) == by_name
