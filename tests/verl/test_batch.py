"""Layer 1: transitions packed into verl's padded batch (no verl import, no training rule)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from verl_helpers import tr

from agentbolt.errors import SchemaError, UserError
from agentbolt_verl.batch import pack_transitions


def test_layout_matches_verl_contract() -> None:
    batch = pack_transitions(
        [
            tr("r1", 0, prompt=[1, 2, 3], response=[4, 5], reward=1.0, group="g"),
            tr("r2", 0, prompt=[6, 7, 8, 9, 10], response=[11, 12, 13, 14], reward=-0.5, group="g"),
        ]
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
    # the reward sits on the last real response token, as verl's agent loop puts reward_score
    assert t["rm_scores"].tolist() == [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, -0.5]]
    assert t["rollout_log_probs"][0].tolist() == pytest.approx([-0.1, -0.2, 0.0, 0.0])
    for key in ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask"):
        assert t[key].dtype == torch.int64, key
    assert t["rm_scores"].dtype == t["rollout_log_probs"].dtype == torch.float32
    assert list(batch.non_tensors["uid"]) == ["g", "g"]
    assert list(batch.non_tensors["rollout_id"]) == ["r1", "r2"]
    assert list(batch.non_tensors["transition_index"]) == [0, 0]
    assert batch.non_tensors["uid"].dtype == object
    assert batch.padding_rows == 0


def test_merged_trajectory_mask_is_honoured() -> None:
    batch = pack_transitions([tr(response=[1, 2, 3, 4, 5], mask=[1, 1, 0, 0, 1])])
    assert batch.tensors["response_mask"].tolist() == [[1, 1, 0, 0, 1]]
    # observation tokens are real tokens: attended, not trained
    assert batch.tensors["attention_mask"][0, -5:].tolist() == [1, 1, 1, 1, 1]


def test_log_probs_only_when_every_row_has_them() -> None:
    batch = pack_transitions([tr("a"), tr("b", logprobs=None)])
    assert "rollout_log_probs" not in batch.tensors


def test_pad_to_multiple_adds_zero_mask_rows_not_copies() -> None:
    batch = pack_transitions([tr(f"r{i}", reward=float(i)) for i in range(5)], multiple_of=4)
    assert len(batch) == 8 and batch.padding_rows == 3
    pads = [i for i, p in enumerate(batch.non_tensors["is_pad"]) if p]
    assert pads == [5, 6, 7] and batch.transitions[5:] == [None] * 3
    t = batch.tensors
    assert t["response_mask"][pads].sum() == 0 and t["rm_scores"][pads].abs().sum() == 0
    # at least one real prompt token: verl's no_padding_2_padding asserts prompt_len > 0
    assert (t["attention_mask"][pads, : batch.prompt_width].sum(-1) == 1).all()
    assert len(set(batch.non_tensors["uid"][pads])) == 3  # each pad row is its own group


def test_what_lightningrl_never_produces_is_refused() -> None:
    with pytest.raises(SchemaError, match="no prompt or no response"):
        pack_transitions([tr(response=[])])
    with pytest.raises(SchemaError, match="mask or logprobs length"):
        pack_transitions([tr(response=[1, 2], mask=[1])])
    with pytest.raises(UserError, match="multiple_of"):
        pack_transitions([tr()], multiple_of=0)


def test_batch_module_imports_no_verl_and_no_training_rule() -> None:
    code = "import sys, agentbolt_verl.batch; print('verl' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


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
    ),
    st.integers(min_value=1, max_value=4),
)
def test_property_rows_round_trip_through_padding(rows, multiple) -> None:
    transitions = [tr(f"r{i}", prompt=p, response=r, reward=w) for i, (p, r, w) in enumerate(rows)]
    batch = pack_transitions(transitions, multiple_of=multiple)
    t = batch.tensors
    p_width = batch.prompt_width
    assert len(batch) % multiple == 0 and len(batch) - batch.padding_rows == len(transitions)
    for i, row in enumerate(transitions):
        attn = t["attention_mask"][i].bool()
        assert t["input_ids"][i][attn].tolist() == row.prompt_ids + row.response_ids
        assert t["position_ids"][i][attn].tolist() == list(range(len(row.prompt_ids) + len(row.response_ids)))
        assert attn[:p_width].tolist() == [False] * (p_width - len(row.prompt_ids)) + [True] * len(row.prompt_ids)
        assert t["rm_scores"][i, len(row.response_ids) - 1].item() == pytest.approx(row.reward)
