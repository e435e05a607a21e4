"""Policies by role in agentbolt-torch: one base model, one LoRA adapter per policy, served together
(mixed-adapter batches, the request's model picks the adapter) and trained apart (own optimizer,
own version), with per-adapter checkpoints; on the tiny random model."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from agentbolt.errors import UserError
from agentbolt.lightningrl import LightningRL
from agentbolt.policies import Policies, match
from agentbolt.types import Transition
from agentbolt_torch.adapters import BASE, activate, adapter_parameters
from agentbolt_torch.generation.engine import GenerationEngine, SamplingParams
from agentbolt_torch.models import tiny_model
from agentbolt_torch.policy import LoraSettings, Policy
from agentbolt_torch.serving.server import POLICY_NAME_HEADER, POLICY_VERSION_HEADER, PolicyServer
from agentbolt_torch.training.algorithm import TorchGRPO
from agentbolt_torch.training.roles import RoleUpdater, load_role_policies, lora_settings_for
from agentbolt_torch.update.updater import PolicyUpdater, UpdateConfig

ROLES = Policies({"writer": match("write_query", rank=4), "rewriter": match("rewrite_query", rank=8, lr=1e-3)})
PROMPT = [1, 5, 9, 12, 30, 31]


def two_adapter_policy() -> Policy:
    model, tokenizer = tiny_model(seed=0)
    adapters = {name: lora_settings_for(spec, None) for name, spec in ROLES.items()}
    return Policy(model, tokenizer, name="tiny", adapters=adapters, autocast_dtype=None)


def role_updater(policy: Policy, lr: float = 5e-2) -> RoleUpdater:
    updaters = {
        name: PolicyUpdater(policy, UpdateConfig(lr=spec.lr or lr, seed=0), adapter=name)
        for name, spec in ROLES.items()
    }
    return RoleUpdater(policy, ROLES, updaters)


def rows_of(policy: Policy, agent: str, adapter: str, n: int = 4) -> list[Transition]:
    """Real samples of ``adapter`` with alternating advantages, attributed to ``agent``."""
    rng = random.Random(0)
    out = []
    with GenerationEngine(policy, batch_window_s=0, seed=1) as engine:
        for i in range(n):
            prompt = [*PROMPT, 40 + i]
            done = engine.generate(prompt, SamplingParams(max_tokens=6), timeout=60, adapter=adapter)[0]
            out.append(
                Transition(
                    rollout_id=f"{agent}-{i}",
                    group_id="g",
                    index=0,
                    agent_name=agent,
                    prompt_ids=prompt,
                    response_ids=done.token_ids,
                    response_logprobs=done.logprobs,
                    policy_version=done.policy_version,
                    advantage=1.0 if i % 2 else -1.0 + rng.random() * 0.1,
                )
            )
    return out


def weights(policy: Policy, adapter: str) -> dict[int, torch.Tensor]:
    return {i: p.detach().clone() for i, p in enumerate(adapter_parameters(policy.model, adapter))}


def base_weights(policy: Policy) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in policy.model.named_parameters() if "lora_" not in k}


def logits_with(policy: Policy, adapter: str) -> torch.Tensor:
    with policy.lock, torch.no_grad():
        activate(policy.model, adapter)
        return policy.model(input_ids=torch.tensor([PROMPT])).logits[0, -1].float()


def test_two_roles_make_two_adapters_on_one_shared_base() -> None:
    policy = two_adapter_policy()
    assert policy.adapters == ("writer", "rewriter") and policy.is_lora
    writer, rewriter = adapter_parameters(policy.model, "writer"), adapter_parameters(policy.model, "rewriter")
    assert not {id(p) for p in writer} & {id(p) for p in rewriter}
    base = sum(p.numel() for n, p in policy.model.named_parameters() if "lora_" not in n)
    total = sum(p.numel() for p in policy.model.parameters())
    assert total == base + sum(p.numel() for p in writer) + sum(p.numel() for p in rewriter)  # base + N adapters
    assert sum(p.numel() for p in rewriter) == 2 * sum(p.numel() for p in writer)  # rank 8 vs rank 4
    assert policy.version_of("writer") == policy.version_of("rewriter") == policy.version_of(BASE) == 0
    with pytest.raises(UserError, match="no adapter 'checker'"):
        policy.version_of("checker")
    with pytest.raises(UserError, match="pass adapter="):
        PolicyUpdater(policy)


def test_after_a_step_only_the_adapters_whose_roles_had_rows_change() -> None:
    policy = two_adapter_policy()
    updater = role_updater(policy)
    rows = rows_of(policy, "write_query", "writer")
    before = {name: weights(policy, name) for name in ROLES}
    base = base_weights(policy)

    metrics = updater.update(rows)

    assert set(metrics.per_policy) == {"writer"} and metrics.idle == ["rewriter"]
    assert metrics.as_dict()["writer/n_transitions"] == 4
    changed = weights(policy, "writer")
    assert any(not torch.equal(changed[i], before["writer"][i]) for i in changed)
    assert all(torch.equal(v, before["rewriter"][i]) for i, v in weights(policy, "rewriter").items())
    assert all(torch.equal(v, base[k]) for k, v in base_weights(policy).items())
    assert policy.version_of("writer") == 1 and policy.version_of("rewriter") == 0
    assert updater.updaters["writer"].optimizer.state and not updater.updaters["rewriter"].optimizer.state
    with pytest.raises(UserError, match="belongs to no policy"):
        updater.update([r.model_copy(update={"agent_name": "check_query"}) for r in rows])


def test_a_call_for_the_writer_is_served_by_the_writer_adapter_with_exact_ids(check_logprobs: Any) -> None:
    openai = pytest.importorskip("openai")
    policy = two_adapter_policy()
    before = logits_with(policy, "writer")
    assert torch.allclose(before, logits_with(policy, "rewriter"))  # fresh adapters start as the base
    role_updater(policy).update(rows_of(policy, "write_query", "writer"))
    assert not torch.allclose(logits_with(policy, "writer"), logits_with(policy, "rewriter"), atol=1e-4)

    with PolicyServer(GenerationEngine(policy, batch_window_s=0.01), served_model_name="tiny") as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=60)
        served = {}
        for model in ("writer", "rewriter", "tiny"):
            raw = client.completions.with_raw_response.create(
                model=model,
                prompt=PROMPT,
                max_tokens=8,
                temperature=0,
                logprobs=1,
                extra_body={"return_token_ids": True},
            )
            choice = raw.parse().choices[0].model_dump()
            served[model] = (raw.headers.get(POLICY_NAME_HEADER), raw.headers[POLICY_VERSION_HEADER], choice)
        listed = {m.id: m.model_dump() for m in client.models.list().data}
        with pytest.raises(openai.NotFoundError, match="served: tiny, writer, rewriter"):
            client.completions.create(model="checker", prompt=PROMPT, max_tokens=2)

    assert served["writer"][:2] == ("writer", "1") and served["rewriter"][:2] == ("rewriter", "0")
    assert served["tiny"][:2] == (None, "0")  # the base model: no adapter, never trained
    assert served["writer"][2]["token_ids"] != served["rewriter"][2]["token_ids"]
    for name in ("writer", "rewriter"):  # exact ids: the logprobs are this adapter's forward pass of these ids
        choice = served[name][2]
        activate(policy.model, name)
        check_logprobs(policy.model, PROMPT, choice["token_ids"], choice["logprobs"]["token_logprobs"])
    assert listed["writer"]["parent"] == "tiny" and set(listed) == {"tiny", "writer", "rewriter"}


def test_calls_of_different_adapters_are_batched_together_and_stay_exact() -> None:
    policy = two_adapter_policy()
    role_updater(policy).update(rows_of(policy, "write_query", "writer"))
    greedy = SamplingParams(max_tokens=8, temperature=0)
    with GenerationEngine(policy, batch_window_s=0.2, seed=0) as engine:
        alone = {a: engine.generate(PROMPT, greedy, timeout=60, adapter=a)[0] for a in ("writer", "rewriter", BASE)}
        before = engine.stats
        handles = [engine.submit(PROMPT, greedy, adapter=a) for a in ("writer", "rewriter", BASE, "writer")]
        together = [h.wait(60)[0] for h in handles]
        stats = engine.stats
    assert stats.max_batch_requests >= 4 and stats.decode_steps - before.decode_steps <= 8  # one batch
    for out, adapter in zip(together, ("writer", "rewriter", BASE, "writer"), strict=True):
        assert out.token_ids == alone[adapter].token_ids
        assert out.logprobs == pytest.approx(alone[adapter].logprobs, abs=1e-4)
        assert out.policy_version == policy.version_of(adapter)
    assert alone["writer"].token_ids != alone["rewriter"].token_ids  # the prompt cache is per adapter
    assert alone["rewriter"].token_ids == alone[BASE].token_ids  # the untrained adapter is still the base


def test_checkpoints_round_trip_per_adapter(tmp_path: Path) -> None:
    policy = two_adapter_policy()
    updater = role_updater(policy)
    rows = rows_of(policy, "write_query", "writer") + rows_of(policy, "rewrite_query", "rewriter")
    updater.update(rows)
    ckpt = updater.save_checkpoint(tmp_path / "ckpt")
    assert sorted(p.name for p in (ckpt / "policies").iterdir()) == ["rewriter", "writer"]
    assert (ckpt / "policies" / "writer" / "adapter" / "adapter_model.safetensors").is_file()
    saved = {name: weights(policy, name) for name in ROLES}
    updater.update(rows)
    expected = {name: weights(policy, name) for name in ROLES}

    resumed_policy = two_adapter_policy()
    resumed = role_updater(resumed_policy)
    resumed.load_checkpoint(ckpt)
    for name in ROLES:
        assert all(torch.equal(v, saved[name][i]) for i, v in weights(resumed_policy, name).items())
        assert resumed_policy.version_of(name) == 1 and resumed.updaters[name].step == 1
    resumed.update(rows)  # optimizer states and RNG restored: the same next step
    for name in ROLES:
        again = weights(resumed_policy, name)
        assert max((again[i] - expected[name][i]).abs().max().item() for i in again) < 1e-6

    only_writer = Policies({"writer": match("write_query", rank=4)})
    p1 = Policy(*tiny_model(seed=0), adapters={"writer": LoraSettings(r=4, alpha=8)}, autocast_dtype=None)
    with pytest.raises(UserError, match="holds policies"):
        RoleUpdater(p1, only_writer, {"writer": PolicyUpdater(p1, adapter="writer")}).load_checkpoint(ckpt)


def test_an_adapter_starts_from_another_runs_weights(tmp_path: Path) -> None:
    policy = two_adapter_policy()
    updater = role_updater(policy)
    updater.update(rows_of(policy, "write_query", "writer"))
    ckpt = updater.save_checkpoint(tmp_path / "ckpt")
    single = Policy(*tiny_model(seed=0), lora=LoraSettings(r=4, alpha=8), autocast_dtype=None)
    PolicyUpdater(single).save_checkpoint(tmp_path / "single")

    policies = Policies(
        {
            "writer": match("write_query", rank=4, init_from=str(ckpt / "policies" / "writer")),
            "rewriter": match("rewrite_query", rank=4, init_from=str(tmp_path / "single")),
        }
    )
    started, started_updater, _ = load_role_policies(
        "tiny",
        policies,
        lora=None,
        update=UpdateConfig(),
        lightningrl=LightningRL().config,
        autocast=None,
        device="cpu",
        seed=0,
    )
    assert all(torch.equal(v, weights(policy, "writer")[i]) for i, v in weights(started, "writer").items())
    assert all(torch.equal(v, weights(single, "default")[i]) for i, v in weights(started, "rewriter").items())
    assert started_updater.updaters["writer"].step == 0 and started.version_of("writer") == 0  # weights only

    wrong_rank = Policies({"writer": match("write_query", rank=8, init_from=str(ckpt / "policies" / "writer"))})
    with pytest.raises(UserError, match="do not fit adapter 'writer'"):
        load_role_policies(
            "tiny",
            wrong_rank,
            lora=None,
            update=UpdateConfig(),
            lightningrl=LightningRL().config,
            autocast=None,
            device="cpu",
            seed=0,
        )
    with pytest.raises(UserError, match="no LoRA adapter there"):
        load_role_policies(
            "tiny",
            Policies({"writer": match("write_query", init_from=str(tmp_path))}),
            lora=None,
            update=UpdateConfig(),
            lightningrl=LightningRL().config,
            autocast=None,
            device="cpu",
            seed=0,
        )


def test_one_shared_policy_loads_todays_single_policy(tmp_path: Path) -> None:
    algorithm = TorchGRPO(
        "tiny",
        policy={"autocast": None},
        output={"out_dir": tmp_path},
    )
    try:
        for shared in (Policies.shared(), Policies({"everything": match()})):
            policy, updater, lrl = algorithm._load(shared)
            assert policy.adapters == () and not policy.is_lora
            assert type(updater) is PolicyUpdater and type(lrl) is LightningRL
            algorithm._serving().stop()
        policy, updater, _ = algorithm._load(ROLES)
        assert policy.adapters == ("writer", "rewriter") and isinstance(updater, RoleUpdater)
        assert updater.updaters["rewriter"].config.lr == 1e-3 and updater.updaters["writer"].config.lr == 1e-5
    finally:
        import asyncio

        asyncio.run(algorithm.close())


async def three_role_agent(task: dict[str, Any], resources: Any) -> float:
    """A writer, a rewriter and a checker, named by the X-Agentbolt-Agent-Name header."""
    import openai

    client = openai.AsyncOpenAI(base_url=resources.llm.base_url, api_key="none", max_retries=0)
    total = 0
    for role in ("write_query", "rewrite_query", "check_query"):
        reply = await client.chat.completions.create(
            model=resources.llm.model,
            messages=[{"role": "user", "content": f"{task['question']} ({role})"}],
            extra_headers={"X-Agentbolt-Agent-Name": role},
        )
        total += len(reply.choices[0].message.content or "")
    return float(total % 2)


def test_two_roles_train_through_the_whole_pipeline(tmp_path: Path) -> None:
    import asyncio
    import json

    from agentbolt import semconv
    from agentbolt.options import RunnerOptions
    from agentbolt.store import open_store
    from agentbolt.trainer import Trainer

    tasks = [{"task_id": f"q{i}", "question": f"What is {i} + {i}?"} for i in range(4)]
    algorithm = TorchGRPO(
        "tiny",
        steps=2,
        batch_size=2,
        group_size=4,
        sampling={"max_tokens": 8},
        evaluation={"every": None},
        generation={"engine": {"batch_window_s": 0.01}},
        output={"out_dir": tmp_path / "out", "checkpoint_every": 2},
        update={"lr": 1e-2},
    )
    store = f"sqlite:///{tmp_path}/runs.db"
    trainer = Trainer(
        three_role_agent,
        algorithm,
        store=store,
        runners=RunnerOptions(n=0, concurrency=8),
        progress=False,
        policies=ROLES,
    )
    result = trainer.fit(tasks, [])

    assert result.steps == 2
    steps = [json.loads(line) for line in Path(result.metrics_path).read_text().splitlines()]
    steps = [r for r in steps if "train/transitions" in r]
    for r in steps:
        assert r["train/writer/n_transitions"] == 8 and r["train/rewriter/n_transitions"] == 8
        assert r["lightningrl/excluded/no_policy"] == 8  # the checker: no policy, never trained
        assert r["lightningrl/policy/writer/transitions"] == 8
        assert abs(r["train/writer/logprob_mismatch"]) < 0.05  # served by the adapter that is trained
        assert "update/loss" not in r
    assert [r["train/writer/policy_version"] for r in steps] == [1, 2]

    async def calls() -> list[tuple[Any, ...]]:
        opened = open_store(store)
        try:
            rollouts = (await opened.query_rollouts(limit=100)).items
            spans = await opened.query_spans([r.rollout_id for r in rollouts])
        finally:
            await opened.close()
        return sorted(
            (
                s.attributes.get(semconv.GEN_AI_AGENT_NAME),
                s.attributes.get(semconv.POLICY_NAME),
                s.attributes[semconv.GEN_AI_REQUEST_MODEL],
                s.attributes.get(semconv.POLICY_VERSION),
            )
            for r in rollouts
            for s in spans[r.rollout_id]
            if semconv.TOKEN_SOURCE in s.attributes
        )

    seen = set(asyncio.run(calls()))
    assert seen == {
        ("check_query", None, "tiny", 0),
        ("rewrite_query", "rewriter", "rewriter", 0),
        ("rewrite_query", "rewriter", "rewriter", 1),
        ("write_query", "writer", "writer", 0),
        ("write_query", "writer", "writer", 1),
    }
    final = Path(result.checkpoint)
    assert (final / "policies" / "writer" / "adapter").is_dir() and (final / "policies" / "rewriter").is_dir()
