"""Layer 1: transitions → verl's padded batch (no verl import)."""

from __future__ import annotations

import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from verl_helpers import tr

from agentbolt.errors import UserError
from agentbolt.types import TokenSource
from agentbolt_verl.batch import BatchOptions, BatchStats, build_batch, prepare_rows

OPTS = BatchOptions(max_prompt_length=8, max_response_length=6)


def test_layout_matches_verl_contract() -> None:
    batch = build_batch(
        [
            tr("r1", 0, prompt=[1, 2, 3], response=[4, 5], reward=1.0, group="g"),
            tr("r2", 0, prompt=[6, 7, 8, 9, 10], response=[11, 12, 13, 14], reward=-0.5, group="g"),
        ],
        OPTS,
    )
    t = batch.tensors
    assert len(batch) == 2 and batch.prompt_width == 5 and batch.response_width == 4
    # prompts are left-padded, responses right-padded, with pad id 0
    assert t["prompts"].tolist() == [[0, 0, 1, 2, 3], [6, 7, 8, 9, 10]]
    assert t["responses"].tolist() == [[4, 5, 0, 0], [11, 12, 13, 14]]
    assert torch.equal(t["input_ids"], torch.cat([t["prompts"], t["responses"]], dim=1))
    assert t["attention_mask"].tolist() == [[0, 0, 1, 1, 1, 1, 1, 0, 0], [1] * 9]
    # verl.utils.model.compute_position_id_with_mask: clip(cumsum(mask) - 1, min=0)
    assert t["position_ids"].tolist() == [[0, 0, 0, 1, 2, 3, 4, 4, 4], list(range(9))]
    assert t["response_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    # the reward sits on the last real response token
    assert t["token_level_scores"].tolist() == [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, -0.5]]
    assert t["rollout_log_probs"][0].tolist() == pytest.approx([-0.1, -0.2, 0.0, 0.0])
    for key in ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask"):
        assert t[key].dtype == torch.int64, key
    assert t["token_level_scores"].dtype == t["rollout_log_probs"].dtype == torch.float32
    assert "advantages" not in t
    assert list(batch.non_tensors["uid"]) == ["g", "g"]
    assert list(batch.non_tensors["rollout_id"]) == ["r1", "r2"]
    assert list(batch.non_tensors["transition_index"]) == [0, 0]
    assert batch.non_tensors["uid"].dtype == object
    assert batch.stats.rows == 2 and batch.stats.dropped == 0


def test_merged_trajectory_mask_is_honoured() -> None:
    batch = build_batch([tr(response=[1, 2, 3, 4, 5], mask=[1, 1, 0, 0, 1])], OPTS)
    assert batch.tensors["response_mask"].tolist() == [[1, 1, 0, 0, 1]]
    # observation tokens are real tokens: attended, not trained
    assert batch.tensors["attention_mask"][0, -5:].tolist() == [1, 1, 1, 1, 1]


def test_overlong_prompt_drop_or_truncate_left() -> None:
    long = list(range(1, 12))  # 11 tokens > 8
    dropped = build_batch([tr(prompt=long), tr("r2")], OPTS)
    assert len(dropped) == 1 and dropped.stats.dropped_overlong_prompt == 1
    kept = build_batch(
        [tr(prompt=long)], BatchOptions(max_prompt_length=8, max_response_length=6, overlong_prompt="truncate")
    )
    assert kept.tensors["prompts"].tolist() == [long[-8:]]
    assert kept.stats.truncated_prompt == 1 and kept.stats.dropped == 0


def test_overlong_response_truncate_right_or_drop() -> None:
    response = [1, 2, 3, 4, 5, 6, 7, 8]
    kept = build_batch([tr(response=response, reward=2.0)], OPTS)  # default: truncate
    assert kept.tensors["responses"].tolist() == [response[:6]]
    assert kept.tensors["rollout_log_probs"].shape == (1, 6)
    assert kept.tensors["token_level_scores"][0].tolist() == [0, 0, 0, 0, 0, 2.0]
    assert kept.stats.truncated_response == 1
    opts = BatchOptions(max_prompt_length=8, max_response_length=6, overlong_response="drop")
    dropped = build_batch([tr(response=response)], opts)
    assert len(dropped) == 0 and dropped.stats.dropped_overlong_response == 1


def test_truncation_that_leaves_nothing_to_train_drops_the_row() -> None:
    batch = build_batch([tr(response=[1, 2, 3, 4, 5, 6, 7], mask=[0] * 6 + [1])], OPTS)
    assert len(batch) == 0 and batch.stats.truncated_response == 1 and batch.stats.dropped_no_trainable_tokens == 1


@pytest.mark.parametrize(
    ("transition", "options", "counter"),
    [
        (tr(response=[]), {}, "dropped_empty_response"),
        (tr(source=TokenSource.MISSING), {}, "dropped_empty_response"),
        (tr(prompt=[]), {}, "dropped_empty_prompt"),
        (tr(response=[1, 2], mask=[1]), {}, "dropped_malformed"),
        (tr(response=[1, 2], logprobs=[-0.1]), {}, "dropped_malformed"),
        (tr(source=TokenSource.RETOKENIZED), {}, "dropped_retokenized"),
        (tr(mask=[0, 0]), {}, "dropped_no_trainable_tokens"),
        (tr(reward=None), {}, "dropped_no_reward"),
        (tr(advantage=None), {"advantages": "transition"}, "dropped_no_advantage"),
        (tr(logprobs=None), {"logprobs": "require"}, "dropped_no_logprobs"),
    ],
)
def test_every_drop_is_counted(transition, options, counter) -> None:
    batch = build_batch(
        [transition, tr("keep", advantage=0.5)], BatchOptions(max_prompt_length=8, max_response_length=6, **options)
    )
    assert len(batch) == 1 and list(batch.non_tensors["rollout_id"]) == ["keep"]
    assert getattr(batch.stats, counter) == 1 and batch.stats.dropped == 1
    assert batch.metrics()[f"agentbolt/batch/{counter}"] == 1.0


def test_fills_and_kept_exceptions_are_counted() -> None:
    opts = BatchOptions(max_prompt_length=8, max_response_length=6, missing_reward="zero", retokenized="keep")
    batch = build_batch([tr(reward=None), tr("r2", source=TokenSource.RETOKENIZED), tr("r3", group=None)], opts)
    assert len(batch) == 3
    assert (
        batch.stats.zero_filled_reward == 1 and batch.stats.retokenized_kept == 1 and batch.stats.missing_group_id == 1
    )
    assert batch.tensors["token_level_scores"][0].sum() == 0
    assert batch.non_tensors["uid"][2] == "r3"  # a transition without group is its own group


def test_logprobs_optional_and_ignore() -> None:
    mixed = [tr("a"), tr("b", logprobs=None)]
    optional = build_batch(mixed, OPTS)
    assert "rollout_log_probs" not in optional.tensors and optional.stats.logprobs_omitted == 1
    ignored = build_batch(mixed, BatchOptions(max_prompt_length=8, max_response_length=6, logprobs="ignore"))
    assert "rollout_log_probs" not in ignored.tensors and ignored.stats.logprobs_omitted == 0


def test_transition_advantages_on_trained_tokens() -> None:
    opts = BatchOptions(max_prompt_length=8, max_response_length=6, advantages="transition")
    batch = build_batch([tr(response=[1, 2, 3], mask=[1, 0, 1], advantage=0.5)], opts)
    assert batch.tensors["advantages"].tolist() == [[0.5, 0.0, 0.5]]


def test_fixed_width() -> None:
    batch = build_batch([tr()], BatchOptions(max_prompt_length=8, max_response_length=6, fixed_width=True))
    assert batch.tensors["prompts"].shape == (1, 8) and batch.tensors["responses"].shape == (1, 6)


def test_pad_to_multiple_adds_zero_mask_rows_not_copies() -> None:
    transitions = [tr(f"r{i}", reward=float(i)) for i in range(5)]
    batch = build_batch(transitions, BatchOptions(max_prompt_length=8, max_response_length=6, multiple_of=4))
    assert len(batch) == 8 and batch.stats.padding_rows == 3 and batch.stats.rows == 5
    pads = [i for i, p in enumerate(batch.non_tensors["is_pad"]) if p]
    assert pads == [5, 6, 7]
    t = batch.tensors
    assert t["response_mask"][pads].sum() == 0 and t["token_level_scores"][pads].abs().sum() == 0
    # at least one real prompt token: verl's no_padding_2_padding asserts prompt_len > 0
    assert (t["attention_mask"][pads, : batch.prompt_width].sum(-1) == 1).all()
    assert len(set(batch.non_tensors["uid"][pads])) == 3  # each pad row is its own group


def test_floor_to_multiple_drops_zero_variance_groups_first() -> None:
    transitions = [
        tr("a1", group="flat", reward=1.0),
        tr("a2", group="flat", reward=1.0),
        tr("b1", group="mixed", reward=0.0),
        tr("b2", group="mixed", reward=1.0),
        tr("c1", group="mixed", reward=1.0),
    ]
    opts = BatchOptions(max_prompt_length=8, max_response_length=6, multiple_of=2, multiple_policy="floor")
    batch = build_batch(transitions, opts)
    assert len(batch) == 4 and batch.stats.dropped_to_multiple == 1 and batch.stats.rows == 4
    assert "a2" not in list(batch.non_tensors["rollout_id"])  # last row of the zero-variance group


def test_transitions_with_advantages_round_trip() -> None:
    transitions = [tr("a", response=[1, 2, 3], mask=[0, 1, 1]), tr("b")]
    batch = build_batch(transitions, BatchOptions(max_prompt_length=8, max_response_length=6, multiple_of=4))
    adv = torch.zeros_like(batch.tensors["response_mask"], dtype=torch.float32)
    adv[0, 1:3] = 0.25
    adv[1, :2] = -1.0
    out = batch.transitions_with_advantages(adv)
    assert [(t.rollout_id, t.advantage) for t in out] == [("a", 0.25), ("b", -1.0)]
    with pytest.raises(UserError, match="shape"):
        batch.transitions_with_advantages(adv[:, :2])


def test_options_are_validated() -> None:
    with pytest.raises(UserError, match="max_prompt_length"):
        BatchOptions(max_prompt_length=0, max_response_length=4)
    with pytest.raises(UserError, match="overlong_prompt must be one of drop, truncate"):
        BatchOptions(max_prompt_length=4, max_response_length=4, overlong_prompt="cut")  # type: ignore[arg-type]


def test_stats_merge_and_batch_module_has_no_verl() -> None:
    a, b = BatchStats(rows=1, dropped_no_reward=2), BatchStats(rows=3, truncated_prompt=1)
    a.merge(b)
    assert (a.rows, a.dropped, a.truncated_prompt) == (4, 2, 1)
    assert "agentbolt_verl.batch" in sys.modules


token = st.integers(min_value=1, max_value=1000)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(token, min_size=1, max_size=12),
            st.lists(token, min_size=1, max_size=9),
            st.floats(min_value=-2, max_value=2, allow_nan=False),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_property_rows_round_trip_through_padding(rows) -> None:
    opts = BatchOptions(max_prompt_length=10, max_response_length=7, overlong_prompt="truncate")
    transitions = [tr(f"r{i}", prompt=p, response=r, reward=w) for i, (p, r, w) in enumerate(rows)]
    kept, _ = prepare_rows(transitions, opts)
    batch = build_batch(transitions, opts)
    t = batch.tensors
    p_width = batch.prompt_width
    assert len(batch) == len(kept)
    for i, row in enumerate(kept):
        attn = t["attention_mask"][i].bool()
        assert t["input_ids"][i][attn].tolist() == row.prompt_ids + row.response_ids
        assert t["position_ids"][i][attn].tolist() == list(range(len(row.prompt_ids) + len(row.response_ids)))
        assert attn[:p_width].tolist() == [False] * (p_width - len(row.prompt_ids)) + [True] * len(row.prompt_ids)
        assert t["token_level_scores"][i].sum().item() == pytest.approx(row.reward)
        assert t["token_level_scores"][i, len(row.response_ids) - 1].item() == pytest.approx(row.reward)
