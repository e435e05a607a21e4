"""One training signal: agentbolt-torch and agentbolt-verl train every token with the same
advantage x loss weight, for every LightningRL choice.

The same rollouts are stored once (a real in-memory store; a runner writes each rollout's spans:
multi-call agents, intermediate rewards, exceptions for AIR, a failed rollout, groups of 4, 3
and 1) and then go down both paths:

- **torch**: ``LightningRL(config).process(rollouts, spans)`` → rows → agentbolt-torch's updater
  pieces (``prepare_items``, ``apply_correction``, ``assign_token_weights``, ``policy_loss``);
- **verl**: each session through the binding's agent loop executor (LightningRL's per-rollout
  step), verl 0.9.1's own ``AgentLoopOutput.as_dict`` (what V1 stores, logprobs in float32), the
  binding's advantage step (:func:`agentbolt_verl.columns.verl_columns`) and the registered
  policy loss ``agentbolt`` (verl's ``compute_policy_loss_vanilla`` underneath).

At ratio 1 the gradient of each path's loss with respect to a token's logprob is
``-advantage x weight``; the test compares it token by token. The matrix: 4 credit assigners x
3 estimators x 2 levels x 4 aggregations, plus merged trajectories and off-policy correction
(token TIS, sequence TIS, sequence MIS, Geo-RS) x 4 aggregations.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from typing import Any

import pytest
import pytest_asyncio
import torch
from omegaconf import OmegaConf

from agentbolt import semconv
from agentbolt.lightningrl import LOSS_AGGREGATIONS, LightningRL, LightningRLConfig
from agentbolt.store.memory import MemoryStore
from agentbolt.types import AttemptStatus, ErrorInfo, ErrorKind, Span, SpanStatus, StatusCode
from agentbolt_torch.update.batches import apply_correction, assign_token_weights, prepare_items
from agentbolt_torch.update.config import UpdateConfig
from agentbolt_torch.update.loss import policy_loss
from agentbolt_verl._verl import import_verl
from agentbolt_verl.binding.rollouts import RolloutExecutor, RolloutRequest
from agentbolt_verl.columns import EXTRA_KEY, verl_columns
from agentbolt_verl.losses import compute_policy_loss_agentbolt

AgentLoopOutput = import_verl("verl.experimental.agent_loop.agent_loop").AgentLoopOutput
AgentLoopMetrics = import_verl("verl.experimental.agent_loop.agent_loop").AgentLoopMetrics

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.filterwarnings("ignore:.*engine is not available:UserWarning"),
]

GROUPS = {"taskA": 4, "taskB": 3, "taskC": 1}
"""Sessions per task (verl's uid): taskC is a group of one."""


def _q(x: float) -> float:
    """Multiples of 1/64: exact in float32, as verl stores logprobs."""
    return round(x * 64) / 64


def _design(uid: str, session: int, rng: random.Random) -> dict[str, Any]:
    calls = rng.randint(1, 3)
    extend = rng.random() < 0.6  # later prompts extend earlier ones: trajectories that can merge
    return {
        "calls": calls,
        "lengths": [rng.randint(1, 5) for _ in range(calls)],
        "extend": extend,
        "intermediate": [rng.choice([None, None, 0.5, -0.25]) for _ in range(calls)],
        "exception_after": rng.randrange(calls) if rng.random() < 0.4 else None,
        "reward": rng.choice([0.0, 0.5, 1.0]),
        "fail": uid == "taskB" and session == 2,  # no return: LightningRL's missing_reward rule
        "seed": rng.randrange(10**6),
    }


DESIGNS = {
    f"verl-{uid}-{s}": _design(uid, s, random.Random(f"{uid}/{s}")) for uid, n in GROUPS.items() for s in range(n)
}


def _spans(rid: str, aid: str) -> list[Span]:
    d = DESIGNS[rid]
    rng = random.Random(d["seed"])
    spans: list[Span] = []
    prompt = [1, 2, 3]
    for k in range(d["calls"]):
        response = [rng.randint(10, 99) for _ in range(d["lengths"][k])]
        attrs = {
            semconv.SPAN_KIND_ATTR: semconv.KIND_LLM,
            semconv.GEN_AI_OPERATION_NAME: semconv.OP_CHAT,
            semconv.PROMPT_TOKEN_IDS: list(prompt),
            semconv.RESPONSE_TOKEN_IDS: response,
            semconv.RESPONSE_LOGPROBS: [_q(-rng.uniform(0.05, 3.0)) for _ in response],
            semconv.TOKEN_SOURCE: "exact",
        }
        spans.append(Span.create(semconv.SPAN_LLM_CALL, rollout_id=rid, attempt_id=aid, attributes=attrs))
        if d["intermediate"][k] is not None:
            reward = {semconv.SPAN_KIND_ATTR: semconv.KIND_REWARD, semconv.REWARD_VALUE: d["intermediate"][k]}
            spans.append(Span.create(semconv.SPAN_REWARD, rollout_id=rid, attempt_id=aid, attributes=reward))
        if d["exception_after"] == k:
            exc = {
                semconv.SPAN_KIND_ATTR: semconv.KIND_EXCEPTION,
                semconv.EXCEPTION_TYPE: "ValueError",
                semconv.EXCEPTION_MESSAGE: "bad tool input",
            }
            status = SpanStatus(code=StatusCode.ERROR, message="bad tool input")
            spans.append(
                Span.create(semconv.SPAN_EXCEPTION, rollout_id=rid, attempt_id=aid, attributes=exc, status=status)
            )
        observation = [7, 8] if d["extend"] else [40 + k]
        prompt = [*prompt, *response, *observation] if d["extend"] else [1, 2, 3, 5 + k]
    return spans


async def _runner(store: MemoryStore) -> None:
    done = 0
    while done < len(DESIGNS):
        for claim in await store.dequeue("runner-1", limit=len(DESIGNS), wait_s=5.0):
            rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
            for span in _spans(rid, aid):  # one by one: the store orders them by seq
                await store.add_spans([span])
            if DESIGNS[rid]["fail"]:
                error = ErrorInfo(kind=ErrorKind.AGENT, type="ValueError", message="agent crashed")
                await store.finish_attempt(aid, AttemptStatus.FAILED, error=error)
            else:
                await store.finish_attempt(aid, AttemptStatus.SUCCEEDED, reward=DESIGNS[rid]["reward"])
            done += 1


def _requests() -> list[RolloutRequest]:
    return [
        RolloutRequest(uid=uid, session_id=s, task_id=uid, global_steps=1)
        for uid, n in GROUPS.items()
        for s in range(n)
    ]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def store():
    """The rollouts, run once by a runner through the binding's executor (as verl's agent loop does)."""
    s = MemoryStore(sweep_interval_s=0.05)
    executor = RolloutExecutor(s)
    await asyncio.gather(asyncio.gather(*(executor.run(r) for r in _requests())), _runner(s))
    yield s
    await s.close()


def _proximal(rollout_id: str, index: int, behaviour: list[float]) -> list[float]:
    """The backend's recomputed logprobs: behaviour plus a deterministic shift (off-policy)."""
    rng = random.Random(f"{rollout_id}/{index}")
    return [_q(b + rng.choice([-0.75, -0.25, 0.0, 0.0, 0.125, 0.5, 1.0])) for b in behaviour]


def _torch_path(config: LightningRLConfig, rollouts, spans) -> dict[tuple[str, int], list[float]]:
    """-dLoss/dlogp per token of agentbolt-torch's updater at ratio 1, by (rollout, call)."""
    rows = LightningRL(config).process(rollouts, spans).rows
    items = prepare_items(rows, max_model_len=10_000)
    correction = config.correction
    if correction is not None:
        for it, row in zip(items, rows, strict=True):
            it.recomputed = _proximal(row.rollout_id, row.index, row.behaviour_logprobs)  # type: ignore[arg-type]
        keys = {id(it): (row.rollout_id, row.index) for it, row in zip(items, rows, strict=True)}
        items, _ = apply_correction(items, correction)
    else:
        keys = {id(it): (row.rollout_id, row.index) for it, row in zip(items, rows, strict=True)}
    assign_token_weights(items, config.loss_aggregation)
    width = max(len(it.response) for it in items)
    logp = torch.zeros((len(items), width))
    for i, it in enumerate(items):
        source = it.recomputed if correction is not None else it.old
        logp[i, : len(it.response)] = torch.tensor(source)
    logp.requires_grad_(True)
    old_logprobs = "recompute" if correction is not None else "rollout"
    loss, _ = policy_loss(
        items, logp, torch.zeros_like(logp), None, UpdateConfig(), measure_mismatch=False, old_logprobs=old_logprobs
    )
    (grad,) = torch.autograd.grad(loss, logp)
    return {keys[id(it)]: (-grad[i, : len(it.response)]).tolist() for i, it in enumerate(items)}


def _actor_config(rows: int) -> Any:
    """What verl's ppo_loss gives a policy loss: ActorConfig's clip fields and global batch info."""
    return OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.28,
            "clip_ratio_c": 3.0,
            "global_batch_info": {"dp_size": 1, "global_batch_size": rows, "batch_num_tokens": None},
        }
    )


async def _verl_path(config: LightningRLConfig, store: MemoryStore) -> dict[tuple[str, int], list[float]]:
    """-dLoss/dlogp per token of agentbolt-verl's registered loss at ratio 1, by (rollout, call)."""
    executor = RolloutExecutor(store, config)  # the finished rollouts are found again, not re-run
    outputs = []
    for request in _requests():
        result = await executor.run(request)
        loop_outputs = [AgentLoopOutput(**fields, metrics=AgentLoopMetrics()) for fields in result.outputs]
        for o in loop_outputs[:-1]:  # what verl's AgentLoopWorkerTQ._agent_loop_postprocess does
            o.reward_score = loop_outputs[-1].reward_score
        outputs += [o.as_dict() for o in loop_outputs]
    rows = len(outputs)
    width = max(len(o["responses"]) for o in outputs)

    def padded(key: str, dtype: torch.dtype) -> torch.Tensor:
        out = torch.zeros((rows, width), dtype=dtype)
        for i, o in enumerate(outputs):
            out[i, : len(o[key])] = o[key]
        return out

    extras = [o["extra_fields"][EXTRA_KEY] for o in outputs]
    behaviour = padded("rollout_log_probs", torch.float32)
    old = behaviour.clone()
    if config.correction is not None:
        for i, (o, e) in enumerate(zip(outputs, extras, strict=True)):
            n = len(o["responses"])
            old[i, :n] = torch.tensor(_proximal(e["rollout_id"], e["index"], behaviour[i, :n].tolist()))
    columns = verl_columns(
        extras,
        [o["prompts"].tolist() for o in outputs],
        [o["responses"].tolist() for o in outputs],
        padded("response_mask", torch.int64),
        config,
        trained_version=None,
        rollout_log_probs=behaviour,
        old_log_probs=old,
    )
    log_prob = old.clone().requires_grad_(True)
    loss, _ = compute_policy_loss_agentbolt(
        old_log_prob=old,
        log_prob=log_prob,
        advantages=columns.advantages,
        response_mask=columns.response_mask,
        config=_actor_config(rows),
        rollout_is_weights=columns.loss_weight,
    )
    (grad,) = torch.autograd.grad(loss, log_prob)
    out = {}
    for i, (o, e) in enumerate(zip(outputs, extras, strict=True)):
        if columns.response_mask[i].any():
            out[(e["rollout_id"], e["index"])] = (-grad[i, : len(o["responses"])]).tolist()
    return out


async def _assert_same_signal(config: LightningRLConfig, store: MemoryStore) -> None:
    ids = list(DESIGNS)
    rollouts = await store.get_rollouts(ids)
    spans = await store.query_spans(ids, latest_attempt_only=True)
    torch_side = _torch_path(config, rollouts, spans)
    verl_side = await _verl_path(config, store)
    assert set(verl_side) == set(torch_side), "the two paths train different calls"
    nonzero = 0
    for key, expected in torch_side.items():
        got = verl_side[key]
        assert len(got) == len(expected), key
        for a, b in zip(got, expected, strict=True):
            assert a == pytest.approx(b, rel=1e-5, abs=1e-8), (key, got, expected)
        nonzero += sum(1 for x in expected if x != 0.0)
    assert nonzero > 0, "the signal is all zero: the comparison would prove nothing"


CREDITS = {
    "final": {},
    "discounted": {"credit_options": {"gamma": 0.8}},
    "intermediate": {},
    "air": {},
}
MATRIX = list(
    itertools.product(CREDITS, ["grpo", "rloo", "reinforce_pp"], ["rollout", "transition"], LOSS_AGGREGATIONS)
)


@pytest.mark.parametrize(("credit", "advantage", "level", "aggregation"), MATRIX)
async def test_torch_and_verl_train_the_same_signal(store, credit, advantage, level, aggregation) -> None:
    config = LightningRLConfig(
        credit=credit,
        advantage=advantage,
        advantage_options={"level": level},
        loss_aggregation=aggregation,
        **CREDITS[credit],
    )
    await _assert_same_signal(config, store)


CORRECTIONS = {
    "token-TIS": {"rollout_is": "token", "rollout_is_threshold": 1.5},
    "sequence-TIS": {"rollout_is": "sequence", "rollout_is_threshold": 2.0},
    "sequence-MIS": {"rollout_is": "sequence", "rollout_rs": "seq_sum_k1", "rollout_rs_threshold": "0.5_2.0"},
    "geo-RS+token-TIS": {"rollout_is": "token", "rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.8_1.25"},
}


@pytest.mark.parametrize("aggregation", LOSS_AGGREGATIONS)
@pytest.mark.parametrize("correction", list(CORRECTIONS))
async def test_the_same_signal_with_off_policy_correction(store, correction, aggregation) -> None:
    await _assert_same_signal(LightningRLConfig(loss_aggregation=aggregation, **CORRECTIONS[correction]), store)


@pytest.mark.parametrize("aggregation", LOSS_AGGREGATIONS)
@pytest.mark.parametrize("level", ["rollout", "transition"])
async def test_the_same_signal_with_merged_trajectories(store, level, aggregation) -> None:
    config = LightningRLConfig(merge=True, advantage_options={"level": level}, loss_aggregation=aggregation)
    rows = (
        LightningRL(config)
        .process(
            await store.get_rollouts(list(DESIGNS)), await store.query_spans(list(DESIGNS), latest_attempt_only=True)
        )
        .rows
    )
    assert any(0 in r.response_mask for r in rows), "no trajectory merged: the case would prove nothing"
    await _assert_same_signal(config, store)
