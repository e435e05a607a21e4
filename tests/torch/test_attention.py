"""Grouped-query attention without key/value copies in passes without gradients (agentbolt_torch.attention)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers.integrations import sdpa_attention  # noqa: E402

from agentbolt_torch.attention import ATTENTION_NAME, use_grouped_attention  # noqa: E402
from agentbolt_torch.models import tiny_model  # noqa: E402
from agentbolt_torch.policy import Policy  # noqa: E402


def _batch(tokenizer):
    """Two left-padded prompts of different lengths, so the model gets an attention mask."""
    ids = torch.tensor([[0, 0, 0, 5, 9, 33, 2], [4, 8, 15, 16, 23, 42, 7]])
    mask = (torch.arange(7)[None, :] >= torch.tensor([[3], [0]])).long()
    ids = ids.masked_fill(mask == 0, tokenizer.pad_token_id)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


@pytest.fixture
def models():
    """The same tiny model twice (grouped-query attention, 4 query heads on 2 key/value heads):
    transformers' ``sdpa``, and switched to the grouped implementation."""
    plain, tokenizer = tiny_model(seed=3)
    grouped = copy.deepcopy(plain)
    assert plain.config._attn_implementation == "sdpa"
    assert use_grouped_attention(grouped)
    assert grouped.config._attn_implementation == ATTENTION_NAME
    return plain, grouped, tokenizer


def _count_repeats(monkeypatch) -> list[int]:
    calls: list[int] = []
    original = sdpa_attention.repeat_kv

    def counted(hidden_states, n_rep):
        calls.append(n_rep)
        return original(hidden_states, n_rep)

    monkeypatch.setattr(sdpa_attention, "repeat_kv", counted)
    return calls


def test_without_gradients_the_kernel_shares_heads_and_the_logits_are_identical(models, monkeypatch):
    plain, grouped, tokenizer = models
    batch = _batch(tokenizer)
    repeats = _count_repeats(monkeypatch)
    with torch.inference_mode():
        expected = plain(**batch).logits
        assert repeats, "transformers' sdpa copies the key/value heads under a mask"
        repeats.clear()
        got = grouped(**batch).logits
    assert repeats == []  # no copies: the kernel's grouped mode
    assert torch.equal(got, expected)


def test_with_gradients_it_is_sdpa_unchanged(models, monkeypatch):
    plain, grouped, tokenizer = models
    batch = _batch(tokenizer)
    repeats = _count_repeats(monkeypatch)
    losses = []
    for model in (plain, grouped):
        model.zero_grad(set_to_none=True)
        logits = model(**batch).logits
        loss = logits.log_softmax(-1)[..., 7].sum()
        loss.backward()
        losses.append((logits.detach(), [p.grad.clone() for p in model.parameters()]))
    assert len(repeats) == 2 * 2 * 2  # two models x two layers x keys and values: both took sdpa's path
    assert torch.equal(losses[0][0], losses[1][0])
    assert all(torch.equal(a, b) for a, b in zip(losses[0][1], losses[1][1], strict=True))


def test_a_policy_switches_sdpa_models_and_leaves_other_implementations_alone():
    model, tokenizer = tiny_model(seed=1)
    assert Policy(model, tokenizer).model.config._attn_implementation == ATTENTION_NAME
    eager, tokenizer = tiny_model(seed=1)
    eager.set_attn_implementation("eager")
    assert not use_grouped_attention(eager)
    assert Policy(eager, tokenizer).model.config._attn_implementation == "eager"
