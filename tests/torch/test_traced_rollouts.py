"""Which training accepts traced rollouts, and how (docs/traces.md, "Training from traces").

A traced rollout (an instrumented agent's OTLP trace, ingested by ``agentbolt.traces``) has
its calls' messages and, at best, token ids rebuilt by retokenization: never the behaviour
policy's logprobs. SFT reads its messages (demonstrations rendered for the policy: no ids
needed), the same whether read from the store, from chat JSONL or from ATIF; LightningRL's RL
rows leave its calls out unless retokenized ids are allowed, and then carry no behaviour
logprobs: off-policy correction refuses them by name, the plain update re-scores them with the
current policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.errors import UserError
from agentbolt.lightningrl import LightningRL, LightningRLConfig, RolloutCorrection
from agentbolt.runs.atif_export import read_atif, rollout_trajectory
from agentbolt.runs.chat_calls import chat_record, rollout_chat_calls
from agentbolt_torch.policy import Policy
from agentbolt_torch.training.demonstrations import (
    demonstrations_from_atif,
    demonstrations_from_jsonl,
    demonstrations_from_spans,
    render_demonstrations,
)
from agentbolt_torch.update.updater import PolicyUpdater, UpdateConfig

SYSTEM = {"role": "system", "content": "Answer with <answer>N</answer>."}


def traced(rollout_id: str, task: str, question: str, answer: str, reward: float | None, tokenizer: Any) -> Any:
    """A rollout as trace ingestion stores it: metadata source "trace", one instrumentation LLM
    span with messages and retokenized ids (the policy's chat template), no logprobs."""
    messages = [SYSTEM, {"role": "user", "content": question}]
    reply = {"role": "assistant", "content": answer}
    prompt = tokenizer.encode(
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), add_special_tokens=False
    )
    response = [*tokenizer.encode(answer, add_special_tokens=False), tokenizer.eos_token_id]
    rollout = t.Rollout(
        rollout_id=rollout_id,
        task_id=task,
        group_id=task,
        run_id="prod",
        status=t.RolloutStatus.SUCCEEDED,
        final_reward=reward,
        current_attempt_id=f"{rollout_id}-a",
        metadata={"agentbolt.source": "trace"},
    )
    span = t.Span(
        rollout_id=rollout_id,
        attempt_id=f"{rollout_id}-a",
        seq=0,
        trace_id=f"{abs(hash(rollout_id)):032x}"[:32],
        span_id="00000000000000a1",
        name="ChatCompletion",
        start_time_ns=1_700_000_000_000_000_000,
        end_time_ns=1_700_000_001_000_000_000,
        attributes={
            semconv.GEN_AI_OPERATION_NAME: semconv.OP_CHAT,
            semconv.GEN_AI_REQUEST_MODEL: "prod-model",
            semconv.GEN_AI_INPUT_MESSAGES: json.dumps(messages),
            semconv.GEN_AI_OUTPUT_MESSAGES: json.dumps([reply]),
            semconv.PROMPT_TOKEN_IDS: list(prompt),
            semconv.RESPONSE_TOKEN_IDS: response,
            semconv.TOKEN_SOURCE: semconv.TOKEN_SOURCE_RETOKENIZED,
        },
    )
    return rollout, [span]


@pytest.fixture
def traces(tiny: tuple[Any, Any]) -> tuple[list[t.Rollout], dict[str, list[t.Span]]]:
    tokenizer = tiny[1]
    made = [
        traced("r1", "a", "What is 3 + 5?", "<answer>8</answer>", 1.0, tokenizer),
        traced("r2", "a", "What is 3 + 5?", "<answer>9</answer>", 0.1, tokenizer),
        traced("r3", "b", "What is 7 - 2?", "<answer>5</answer>", 1.0, tokenizer),
        traced("r4", "b", "What is 7 - 2?", "<answer>5</answer>", 1.0, tokenizer),
        traced("r5", "c", "What is 6 + 6?", "no idea", None, tokenizer),
    ]
    return [r for r, _ in made], {r.rollout_id: s for r, s in made}


def _key(demos: list[Any]) -> list[tuple[str, str, str]]:
    return sorted((d.episode, json.dumps(d.messages), json.dumps(d.reply)) for d in demos)


def test_sft_takes_the_best_traces_from_the_store_chat_jsonl_and_atif_alike(
    traces: tuple[list[t.Rollout], dict[str, list[t.Span]]], tiny: tuple[Any, Any], tmp_path: Path
) -> None:
    rollouts, spans = traces
    from_store = demonstrations_from_spans(rollouts, spans, threshold=1.0)
    assert sorted(d.episode for d in from_store) == ["r1", "r3", "r4"]  # reward >= 1.0 only
    assert [d.episode for d in demonstrations_from_spans(rollouts, spans, threshold=1.0, best_k=1)] == ["r1", "r3"]

    chat = tmp_path / "best.jsonl"
    chat.write_text(
        "".join(
            json.dumps(chat_record(r, c)) + "\n" for r in rollouts for c in rollout_chat_calls(r, spans[r.rollout_id])
        )
    )
    atif_file = tmp_path / "best.atif.jsonl"
    atif_file.write_text(
        "".join(json.dumps(rollout_trajectory(r, spans[r.rollout_id]).to_json_dict()) + "\n" for r in rollouts)
    )
    from_jsonl = demonstrations_from_jsonl(chat, min_reward=1.0)
    from_atif = demonstrations_from_atif(read_atif(atif_file), threshold=1.0)
    assert _key(from_store) == _key(from_jsonl) == _key(from_atif)  # one data set, three ways in

    # rendered for the policy's own tokenizer: the retokenized ids were not needed
    transitions, skipped = render_demonstrations(tiny[1], from_store, max_len=2048)
    assert len(transitions) == 3 and not skipped
    assert transitions[0].response_ids == spans["r1"][0].attributes[semconv.RESPONSE_TOKEN_IDS]


def test_chat_jsonl_lines_must_end_on_the_reply(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    with pytest.raises(UserError, match=r"bad.jsonl:1: the last message must be the assistant reply"):
        demonstrations_from_jsonl(bad)


def test_rl_rows_from_traces_have_no_behaviour_logprobs(
    traces: tuple[list[t.Rollout], dict[str, list[t.Span]]], tiny: tuple[Any, Any]
) -> None:
    rollouts, spans = traces
    # by default LightningRL trains only on ids the backend sampled: every traced call is left out
    default = LightningRL(LightningRLConfig()).collect(rollouts, spans)
    assert not default.transitions and default.report.excluded.get("retokenized") == 5

    # off-policy correction needs the behaviour policy's logprobs: traced calls are left out by name
    corrected = LightningRL(LightningRLConfig(allow_retokenized=True, rollout_is="token")).collect(rollouts, spans)
    assert not corrected.transitions and corrected.report.excluded.get("no_logprobs") == 5

    # allowed without correction: rows without behaviour logprobs (the update re-scores them)
    batch = LightningRL(LightningRLConfig(allow_retokenized=True)).process(rollouts, spans)
    assert len(batch.rows) == 4 and all(r.behaviour_logprobs is None for r in batch.rows)  # r5 has no reward
    assert any(r.advantage for r in batch.rows)  # task a: 1.0 vs 0.1 within its group
    assert {tr.token_source for tr in batch.transitions} == {t.TokenSource.RETOKENIZED}

    # the update takes them with the current policy as behaviour policy: its first ratio is exactly 1
    import copy

    model = copy.deepcopy(tiny[0])
    updater = PolicyUpdater(Policy(model, tiny[1], name="tiny", autocast_dtype=None), UpdateConfig(lr=1e-4))
    metrics = updater.update(batch.rows)
    assert metrics.ratio_mean == pytest.approx(1.0, abs=1e-5) and metrics.clip_frac == 0.0
    assert metrics.logprob_mismatch != metrics.logprob_mismatch  # NaN: there was nothing to compare with

    # and an update asked for off-policy correction refuses rows without them, naming what is missing
    strict = PolicyUpdater(
        Policy(copy.deepcopy(tiny[0]), tiny[1], name="tiny", autocast_dtype=None),
        UpdateConfig(lr=1e-4),
        correction=RolloutCorrection(rollout_is="token"),
    )
    with pytest.raises(UserError, match="no behaviour \\(sampling\\) logprobs"):
        strict.update(batch.rows)
