"""Asynchronous training in agentbolt-torch: the serving copy and its swap, and ``torch-grpo`` with
``max_staleness`` end to end (Trainer -> store -> runner -> agent -> gateway -> policy server ->
LightningRL -> update) on the tiny random model."""

from __future__ import annotations

import asyncio
import copy
import math
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from agentbolt import semconv
from agentbolt.algorithm import Evaluate, as_tasks, batches
from agentbolt.errors import UserError
from agentbolt.lightningrl import LightningRLConfig
from agentbolt.options import RunnerOptions
from agentbolt.policies import Policies, match
from agentbolt.store import open_store
from agentbolt.trainer import Trainer
from agentbolt.types import Resources, RolloutMode
from agentbolt_torch.generation.engine import GenerationEngine, SamplingParams
from agentbolt_torch.generation.serving_copy import ServingWeights
from agentbolt_torch.models import tiny_model
from agentbolt_torch.policy import LoraSettings, Policy
from agentbolt_torch.training.algorithm import TorchGRPO

# -- the serving copy -------------------------------------------------------------------------


def _perturb(model: Any, scale: float, seed: int = 1) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator))


def _token_logprobs(model: Any, prompt: list[int], response: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None]).squeeze(1)


def test_the_copy_serves_while_the_policy_trains_and_the_swap_serves_the_new_weights() -> None:
    model, tokenizer = tiny_model(seed=0)
    before = copy.deepcopy(model)
    policy = Policy(model, tokenizer, name="tiny", autocast_dtype=None)
    prompt = tokenizer("swap check")["input_ids"]
    params = SamplingParams(max_tokens=6, seed=1, ignore_eos=True)
    with GenerationEngine(policy, batch_window_s=0) as engine:
        engine.serve_copy()
        with policy.lock:  # what PolicyUpdater.update holds for the whole update
            _perturb(model, 0.5)
            policy.mark_weights_changed()
            policy.bump_version()
            served = engine.generate(prompt, params, timeout=60)[0]  # answered while the policy is locked
        assert served.policy_version == 0 and engine.served_version == 0 and policy.version == 1
        assert torch.allclose(
            _token_logprobs(before, prompt, served.token_ids), torch.tensor(served.logprobs), atol=1e-4
        )

        result = engine.swap_weights(drain=True)
        assert (result.version, result.previous_version, result.drain, result.carried_rows) == (1, 0, True, 0)
        fresh = engine.generate(prompt, params, timeout=60)[0]
    assert fresh.policy_version == 1
    assert torch.allclose(_token_logprobs(model, prompt, fresh.token_ids), torch.tensor(fresh.logprobs), atol=1e-4)


def test_an_in_place_swap_carries_calls_in_flight_with_the_version_they_started_with() -> None:
    model, tokenizer = tiny_model(seed=0)
    before = copy.deepcopy(model)
    policy = Policy(model, tokenizer, name="tiny", autocast_dtype=None)
    prompt = tokenizer("in place")["input_ids"]
    with GenerationEngine(policy, batch_window_s=0) as engine:
        weights = engine.serve_copy()
        handle = engine.submit(prompt, SamplingParams(max_tokens=120, ignore_eos=True, seed=3))
        deadline = time.monotonic() + 60
        while engine.stats.generated_tokens < 3 and time.monotonic() < deadline:
            time.sleep(0.001)
        swaps: list[Any] = []
        with weights.lock:  # generation stops at its next forward pass, the row in flight
            _perturb(model, 0.5)
            policy.mark_weights_changed()
            policy.bump_version()
            swapper = threading.Thread(target=lambda: swaps.append(engine.swap_weights(drain=False)))
            swapper.start()
            time.sleep(0.05)
        swapper.join(60)
        out = handle.wait(60)[0]
    (swap,) = swaps
    assert swap.carried_rows == 1 and not swap.drain and swap.version == 1
    assert out.policy_version == 0 and len(out.token_ids) == 120  # the version it started with
    old = _token_logprobs(before, prompt, out.token_ids)
    reported = torch.tensor(out.logprobs)
    assert torch.allclose(old[:3], reported[:3], atol=1e-4)  # sampled before the swap: the old weights
    assert not torch.allclose(old[-5:], reported[-5:], atol=1e-2)  # after it: the new ones


def test_the_copy_shares_frozen_parameters() -> None:
    pytest.importorskip("peft")
    model, tokenizer = tiny_model(seed=0)
    policy = Policy(model, tokenizer, name="tiny", autocast_dtype=None, lora=LoraSettings(r=4, alpha=8))
    weights = ServingWeights(policy)
    own = {name: p for name, p in policy.model.named_parameters()}
    for name, p in weights.model.named_parameters():
        assert (p is own[name]) == (not own[name].requires_grad), name  # frozen shared, adapters copied
        assert not p.requires_grad
    trainable = sum(p.numel() * p.element_size() for p in own.values() if p.requires_grad)
    assert weights.nbytes == trainable < sum(p.numel() * p.element_size() for p in own.values()) / 4


def test_swap_needs_a_copy() -> None:
    model, tokenizer = tiny_model(seed=0)
    engine = GenerationEngine(Policy(model, tokenizer, autocast_dtype=None))
    with pytest.raises(UserError, match="serve_copy"):
        engine.swap_weights()


def test_max_staleness_needs_an_asynchronous_algorithm() -> None:
    trainer = Trainer(lambda task, resources: 1.0, Evaluate(), store="memory://", runners=RunnerOptions(n=0))
    with pytest.raises(UserError, match="no asynchronous mode"):
        trainer.fit([{"q": 1}], max_staleness=1)
    algorithm = TorchGRPO("tiny")
    with pytest.raises(UserError, match="max_staleness must be an integer"):
        algorithm.set_max_staleness(-1)
    algorithm.set_max_staleness(2)
    assert algorithm.lightningrl.max_staleness == 2


def test_max_staleness_is_refused_for_sft_on_demonstrations(tmp_path: Path) -> None:
    """Offline SFT samples nothing: an asynchronous bound there is a mistake, said before any work."""
    from agentbolt_torch.training.demonstrations import Demonstration
    from agentbolt_torch.training.sft import TorchSFT

    demo = Demonstration(messages=[{"role": "user", "content": "2+2?"}], reply={"content": "4"}, episode="e0")
    algorithm = TorchSFT(
        "tiny",
        steps=1,
        demonstrations=[demo],
        evaluation={"every": None},
        output={"out_dir": tmp_path, "plot": False},
    )
    trainer = Trainer(one_call_agent, algorithm, store="memory://", runners=RunnerOptions(n=0), progress=False)
    with pytest.raises(UserError, match="demonstrations here: nothing is sampled, so max_staleness does not apply"):
        trainer.fit([], max_staleness=1)


# -- torch-grpo with max_staleness ------------------------------------------------------------


async def one_call_agent(task: dict[str, Any], resources: Resources) -> float:
    """One call; the reward is the parity of the reply's length (variance inside a group)."""
    import openai

    assert resources.llm is not None
    client = openai.AsyncOpenAI(base_url=resources.llm.base_url, api_key="none", max_retries=0)
    reply = await client.chat.completions.create(
        model=resources.llm.model, messages=[{"role": "user", "content": task["question"]}]
    )
    return float(len(reply.choices[0].message.content or "") % 2)


def _tasks(n: int) -> list[dict[str, Any]]:
    return [{"task_id": f"q{i}", "question": f"What is {i} + {i}?"} for i in range(n)]


def _calls(url: str) -> dict[tuple[str, int], tuple[Any, ...]]:
    """Every train rollout's LLM calls from the store: (task:k, call index) -> ids, logprobs, version."""

    async def read() -> dict[tuple[str, int], tuple[Any, ...]]:
        store = open_store(url)
        try:
            page = await store.query_rollouts(mode=RolloutMode.TRAIN, limit=1000)
            spans = await store.query_spans([r.rollout_id for r in page.items])
        finally:
            await store.close()
        out = {}
        for r in page.items:
            calls = [s for s in spans[r.rollout_id] if semconv.TOKEN_SOURCE in s.attributes]
            key = r.rollout_id.split(":", 1)[1]  # without the run id
            for i, s in enumerate(calls):
                a = s.attributes
                out[(key, i)] = (
                    list(a[semconv.PROMPT_TOKEN_IDS]),
                    list(a[semconv.RESPONSE_TOKEN_IDS]),
                    list(a[semconv.RESPONSE_LOGPROBS]),
                    a.get(semconv.POLICY_VERSION),
                    r.final_reward,
                )
        return out

    return asyncio.run(read())


def test_max_staleness_0_trains_exactly_what_the_synchronous_loop_trains(tmp_path: Path) -> None:
    """Same rollouts, same calls (ids, logprobs, versions, rewards), same weights, bit for bit."""
    runs = {}
    for name, bound in (("sync", None), ("async0", 0)):
        algorithm = TorchGRPO(
            "tiny",
            steps=3,
            batch_size=2,
            group_size=2,
            sampling={"max_tokens": 8},
            evaluation={"every": None},
            policy={"autocast": None},
            generation={"engine": {"batch_window_s": 0}},
            output={"out_dir": tmp_path / name, "checkpoint_every": 3, "plot": False},
            update={"lr": 1e-2},
        )
        url = f"sqlite:///{tmp_path}/{name}.db"
        # one rollout at a time: the engine's sampler draws in the same order in both runs
        trainer = Trainer(
            one_call_agent, algorithm, store=url, runners=RunnerOptions(n=0, concurrency=1), progress=False
        )
        result = trainer.fit(_tasks(6), max_staleness=bound)
        assert result.steps == 3 and result.policy_version == 3 and result.max_staleness == bound
        runs[name] = (_calls(url), load_file(Path(result.checkpoint) / "model" / "model.safetensors"), result)
    (sync_calls, sync_weights, _), (async_calls, async_weights, result) = runs["sync"], runs["async0"]
    assert len(sync_calls) == 12 and sync_calls == async_calls
    assert sync_weights.keys() == async_weights.keys()
    assert all(torch.equal(sync_weights[k], async_weights[k]) for k in sync_weights)
    assert result.stale_calls == 0 and result.untrained_rollouts == 0


class _Recording(TorchGRPO):
    """``torch-grpo`` recording what each step took and trained (for the ledger below)."""

    def __init__(self, *args: Any, on_version: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.taken: list[list[str]] = []
        self.trained: list[tuple[int, list[tuple[str, int, int | None]]]] = []
        """Per update: the version being trained, and the rows (rollout id, call index, call version).
        With policies by role one entry per policy with rows, at its adapter's version."""
        self.on_version = on_version

    async def train_rollouts(self, run: Any, step: int, rollouts: Any, *, update: Any, timing: Any) -> Any:
        self.taken.append([r.rollout_id for r in rollouts])

        async def recording(rows: list[Any]) -> Any:
            policies = run.ctx.policies
            if policies.is_shared:
                self.trained.append((run.policy.version, [(r.rollout_id, r.index, r.policy_version) for r in rows]))
            else:  # each policy's rows against its own adapter's version
                for name in policies:
                    own = [r for r in rows if policies.policy_for(r.agent_name) == name]
                    if own:
                        version = run.policy.version_of(name)
                        self.trained.append((version, [(r.rollout_id, r.index, r.policy_version) for r in own]))
            out = await update(rows)  # the update, the swap and the new resources
            self.on_version(run.policy)
            return out

        return await super().train_rollouts(run, step, rollouts, update=recording, timing=timing)


@pytest.mark.parametrize("swap", ["inplace", "drain"])
def test_async_ledger_no_call_trained_twice_or_lost_bound_kept_stale_counted(tmp_path: Path, swap: str) -> None:
    """max_staleness=1 with a straggler whose rollout spans two weight swaps, for both swaps
    (the drained one with token TIS and sequence MIS, whose weights the update reports):
    :func:`check_async_ledger` on agentbolt's own generator."""
    check_async_ledger(tmp_path, swap)


ROLES = {"writer": "write_query", "rewriter": "rewrite_query"}
"""Policies by role for the ledger: policy -> its agent."""


@pytest.mark.parametrize("swap", ["inplace", "drain"])
def test_async_ledger_with_policies_by_role_bounds_each_adapter(tmp_path: Path, swap: str) -> None:
    """The same ledger with two policies by role (one LoRA adapter each on a shared base): the
    straggler's first call is the writer's, its second the rewriter's; each call's staleness is
    measured from its own adapter's version, and each adapter moves one version per step."""
    algorithm = check_async_ledger(tmp_path, swap, roles=True)
    versions = [version for version, _ in algorithm.trained]
    assert max(versions) == 5 and len(versions) == 12  # both adapters trained at every step


def check_async_ledger(
    tmp_path: Path,
    swap: str,
    *,
    model: str = "tiny",
    generation: dict[str, Any] | None = None,
    roles: bool = False,
) -> _Recording:
    """max_staleness=1 with a straggler whose rollout spans two weight swaps on ``model`` served
    by the generator ``generation`` chooses (tests/torch/test_vllm_training.py: vLLM); with
    ``roles``, under two policies by role (:data:`ROLES`: each call's agent, its adapter and its
    own version).

    The first rollout to start makes its first call at version 0, then waits until version 2 is
    served and makes its second call; rollouts of batches >= 3 wait until it has finished, so the
    straggler's group is the oldest finished one when step 3 takes its groups: trained at
    version 2, its first call (staleness 2) is dropped and counted, its second (staleness 0)
    trained. Every rollout is taken by exactly one step, every call of a taken rollout is trained
    once or counted as left out, and every trained call is within the bound.
    """
    train = _tasks(12)
    order = [task.task_id for batch in batches(as_tasks(train), 2, seed=0) for task in batch]
    late = set(order[6:])  # the tasks of data batches 3, 4 and 5
    released, straggler_done = threading.Event(), threading.Event()
    straggler: dict[str, Any] = {}
    lock = threading.Lock()

    async def agent(task: dict[str, Any], resources: Resources) -> float:
        import openai

        assert resources.llm is not None
        with lock:
            me = not straggler
            if me:
                straggler["task"] = task["task_id"]
        if task["task_id"] in late:
            await asyncio.to_thread(straggler_done.wait, 120)
        client = openai.AsyncOpenAI(base_url=resources.llm.base_url, api_key="none", max_retries=0)
        agents = [{"X-Agentbolt-Agent-Name": agent} for agent in ROLES.values()] if roles else [{}, {}]
        messages = [{"role": "user", "content": task["question"]}]
        first = await client.chat.completions.create(
            model=resources.llm.model, messages=messages, extra_headers=agents[0]
        )
        if me:
            await asyncio.to_thread(released.wait, 120)
        text = first.choices[0].message.content or ""
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Again?"}]
        second = await client.chat.completions.create(
            model=resources.llm.model, messages=messages, extra_headers=agents[1]
        )
        if me:
            straggler["texts"] = [text, second.choices[0].message.content or ""]
            straggler_done.set()
        return float(len(text + (second.choices[0].message.content or "")) % 2)

    algorithm = _Recording(
        model,
        steps=6,
        batch_size=2,
        group_size=2,
        sampling={"max_tokens": 8},
        evaluation={"every": None},
        policy={"autocast": None},
        generation={"swap": swap, **(generation or {"engine": {"batch_window_s": 0.01}})},
        output={"out_dir": tmp_path / "out", "plot": False},
        update={"lr": 1e-2},
        lightningrl=LightningRLConfig(rollout_is="token", rollout_rs="seq_sum_k1", rollout_rs_threshold=10.0)
        if swap == "drain"
        else None,
        on_version=lambda policy: released.set() if policy.version_of("writer" if roles else None) >= 2 else None,
    )
    url = f"sqlite:///{tmp_path}/runs.db"
    policies = Policies({name: match(agent, rank=4) for name, agent in ROLES.items()}) if roles else None
    trainer = Trainer(
        agent, algorithm, store=url, runners=RunnerOptions(n=0, concurrency=8), progress=False, policies=policies
    )
    result = trainer.fit(train, max_staleness=1)
    assert result.steps == 6 and result.policy_version == (12 if roles else 6)  # roles: each adapter's update counts

    taken = [rid for step in algorithm.taken for rid in step]
    assert len(taken) == len(set(taken)) == 24, "a rollout taken twice, or lost"
    rows = [row for _, step_rows in algorithm.trained for row in step_rows]
    assert len({(rid, index) for rid, index, _ in rows}) == len(rows), "a call trained twice"
    for version, step_rows in algorithm.trained:
        assert all(v is not None and 0 <= version - v <= 1 for _, _, v in step_rows), (version, step_rows)

    calls = _calls(url)
    assert len(calls) == 48  # every rollout's two calls are in the store
    trained_keys = {(rid.split(":", 1)[1], index) for rid, index, _ in rows}
    history = [h for h in result.history if "train/transitions" in h]  # the trained steps
    left_out = sum(v for h in history for k, v in h.items() if k.startswith("lightningrl/excluded/"))
    assert len(trained_keys) + left_out == len(calls), "a call neither trained nor counted"
    assert sum(h.get("async/stale_calls", 0) for h in history) == result.stale_calls >= 1
    assert result.untrained_rollouts == 0
    assert len(history) == 6
    updates = [f"train/{name}/" for name in ROLES] if roles else ["update/"]  # each policy's update metrics
    if swap == "drain":  # the correction's weights: behaviour (sampling) vs recomputed logprobs
        assert all(
            math.isfinite(h[f"{u}is_weight_mean"]) and h[f"{u}is_weight_max"] > 0 for h in history for u in updates
        )
        assert all(0 <= h[f"{u}rs_masked_frac"] <= 1 for h in history for u in updates)
    else:
        assert all(f"{u}is_weight_mean" not in h for h in history for u in updates)

    # the straggler: its calls keep their own versions and exact ids; the stale one is not trained
    mine = {k[0] for k in calls if k[0].split(":")[1] == straggler["task"]}
    (prefix,) = {p for p in mine if calls[(p, 0)][3] != calls[(p, 1)][3]}
    assert [calls[(prefix, i)][3] for i in range(2)] == [0, 2]
    assert (prefix, 0) not in trained_keys and (prefix, 1) in trained_keys
    tokenizer = tiny_model(seed=0)[1]
    for i, text in enumerate(straggler["texts"]):
        _, response_ids, logprobs, _, _ = calls[(prefix, i)]
        assert len(response_ids) == len(logprobs) > 0
        assert text in tokenizer.decode(response_ids, skip_special_tokens=True)
    return algorithm
