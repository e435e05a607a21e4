"""Layer 2: the batch as verl's DataProto, through verl's own padding converters."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from verl_helpers import tr

from agentbolt_verl import to_verl
from agentbolt_verl.batch import pack_transitions


@pytest.fixture
def batch():
    transitions = [
        tr("r1", 0, prompt=[5, 6, 7], response=[8, 9], group="g1", reward=1.0),
        tr("r1", 1, prompt=[5, 6, 7, 8, 9, 30], response=[31, 32, 33, 34, 35], mask=[1, 1, 0, 0, 1], group="g1"),
        tr("r2", 0, prompt=[40], response=[41, 42, 43, 44, 45, 46, 47, 48], group="g1", reward=0.0),
    ]
    return pack_transitions(transitions, multiple_of=4)


def test_dataproto_round_trip(batch) -> None:
    dp = to_verl.to_dataproto(batch, temperature=0.7, global_steps=3)
    assert len(dp) == 4
    assert set(dp.batch.keys()) == set(batch.tensors)
    assert all(v.dtype == object for v in dp.non_tensor_batch.values())
    assert dp.meta_info["temperature"] == 0.7 and dp.meta_info["global_steps"] == 3
    assert dp.meta_info["global_token_num"] == batch.tensors["attention_mask"].sum(-1).tolist()
    back = to_verl.from_dataproto(dp)
    for key, value in batch.tensors.items():
        assert torch.equal(back.tensors[key], value), key
    for key, value in batch.non_tensors.items():
        assert list(back.non_tensors[key]) == list(value), key
    assert back.padding_rows == 1 and len(back) == 4 and back.transitions == []
    # DataProto's own row operations keep the columns together
    sub = dp.select_idxs(np.array([2, 0]))
    assert list(sub.non_tensor_batch["rollout_id"]) == ["r2", "r1"]
    assert torch.equal(sub.batch["responses"][1], batch.tensors["responses"][0])


def test_verl_padding_converters_round_trip(batch) -> None:
    dp = to_verl.to_dataproto(batch)
    td = to_verl.to_no_padding(dp)
    attn = batch.tensors["attention_mask"].bool()
    lengths = attn.sum(-1)
    ids = td["input_ids"]
    assert ids.is_nested
    assert ids.offsets().diff().tolist() == lengths.tolist()
    assert ids.values().tolist() == batch.tensors["input_ids"][attn].tolist()
    assert td["position_ids"].values().tolist() == [p for n in lengths.tolist() for p in range(n)]
    assert torch.equal(td["loss_mask"], batch.tensors["response_mask"])

    # A per-token "model output" whose value at position j is the id of token j + 1 (what a
    # log-prob at j is about). verl's no_padding_2_padding must align it with `responses`.
    values, offsets = ids.values(), ids.offsets()
    shifted = torch.cat([torch.cat([values[s + 1 : e], values[e - 1 : e]]) for s, e in itertools.pairwise(offsets)])
    out = to_verl.response_values(torch.nested.nested_tensor_from_jagged(shifted.float(), offsets=offsets), td)
    response_attn = attn[:, batch.prompt_width :]
    assert out.shape == batch.tensors["responses"].shape
    assert torch.equal(out[response_attn].long(), batch.tensors["responses"][response_attn])
    assert out[~response_attn].abs().sum() == 0
