"""The policy update: loss weighting, KL, on-policy ratios, LoRA, micro-batching, checkpoints."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from agentbolt.errors import UserError
from agentbolt.lightningrl import LOSS_AGGREGATIONS, LightningRLConfig, rollout_correction, row_weights, training_rows
from agentbolt.types import Transition
from agentbolt_torch.generation.engine import GenerationEngine, SamplingParams
from agentbolt_torch.models import tiny_model
from agentbolt_torch.policy import LoraSettings, Policy
from agentbolt_torch.update.updater import PolicyUpdater, UpdateConfig, kl_penalty


def fresh_policy(*, lora: LoraSettings | None = None, autocast: bool = True, seed: int = 0) -> Policy:
    model, tokenizer = tiny_model(seed=seed)
    return Policy(model, tokenizer, name="tiny", lora=lora, autocast_dtype="bfloat16" if autocast else None)


def rollout_transitions(policy: Policy, n_tasks: int = 3, group: int = 2, max_tokens: int = 10) -> list[Transition]:
    """Sample real responses with the engine and give them GRPO-like advantages; the second call of
    each rollout has a longer prompt (a multi-call agent)."""
    tok = policy.tokenizer
    rng = random.Random(0)
    out = []
    with GenerationEngine(policy, batch_window_s=0, seed=1) as engine:
        for task in range(n_tasks):
            for g in range(group):
                rid = f"t{task}-g{g}"
                advantage = rng.uniform(-1, 1)
                prompt = tok(f"What is {task} + {g}?")["input_ids"]
                for call in range(2):
                    completion = engine.generate(prompt, SamplingParams(max_tokens=max_tokens), timeout=60)[0]
                    out.append(
                        Transition(
                            rollout_id=rid,
                            group_id=f"t{task}",
                            index=call,
                            prompt_ids=prompt,
                            response_ids=completion.token_ids,
                            response_logprobs=completion.logprobs,
                            advantage=advantage,
                        )
                    )
                    prompt = prompt + completion.token_ids + tok(" ok then")["input_ids"]
    return out


def trainable(policy: Policy) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in policy.model.named_parameters() if v.requires_grad}


@pytest.mark.parametrize("mode", LOSS_AGGREGATIONS)
def test_loss_is_aggregated_with_cores_weights(mode: str) -> None:
    """On policy (ratio exactly 1) the policy-gradient loss is -Σ_t w_t · n_t · A_t with core's
    row weights: the updater has no aggregation of its own."""
    policy = fresh_policy()
    transitions = rollout_transitions(policy)
    weights = row_weights([t.rollout_id for t in transitions], [len(t.response_ids) for t in transitions], mode)
    expected = -math.fsum(
        w * len(t.response_ids) * (t.advantage or 0.0) for t, w in zip(transitions, weights, strict=True)
    )
    updater = PolicyUpdater(policy, UpdateConfig(old_logprobs="recompute"), loss_aggregation=mode)  # type: ignore[arg-type]
    metrics = updater.update(transitions)
    assert metrics.ratio_mean == pytest.approx(1.0)
    assert metrics.pg_loss == pytest.approx(expected, rel=1e-4, abs=1e-6)


def test_unknown_loss_aggregation_lists_the_valid_ones() -> None:
    with pytest.raises(UserError, match="valid names: rollout-mean-token-mean, token-mean"):
        PolicyUpdater(fresh_policy(), loss_aggregation="rollout-mean")  # type: ignore[arg-type]


def test_kl_estimators_zero_when_equal() -> None:
    logp = torch.tensor([-0.5, -2.0, -7.0])
    for estimator in ("k1", "k2", "k3"):
        assert kl_penalty(logp, logp.clone(), estimator).abs().max().item() == 0.0
    assert (kl_penalty(logp, logp - 1.0, "k3") >= 0).all()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("lora", [None, LoraSettings(r=4, alpha=8)], ids=["full", "lora"])
def test_two_step_update_changes_weights(lora: LoraSettings | None) -> None:
    policy = fresh_policy(lora=lora)
    transitions = rollout_transitions(policy)
    updater = PolicyUpdater(
        policy, UpdateConfig(lr=1e-3 if lora is None else 1e-2, kl_coef=0.05, micro_batch_tokens=96)
    )
    before = trainable(policy)
    if lora is not None:
        assert all("lora_" in k for k in before)
    metrics = [updater.update(transitions) for _ in range(2)]
    for m in metrics:
        assert math.isfinite(m.loss) and math.isfinite(m.kl) and math.isfinite(m.entropy)
        assert m.micro_batches > 1 and m.n_rollouts == 6 and m.n_transitions == 12
        assert m.tokens_per_s > 0
    assert metrics[0].kl == 0.0, "the first step starts at the reference"
    assert metrics[1].kl > 0.0
    assert [m.policy_version for m in metrics] == [1, 2] and policy.version == 2
    after = trainable(policy)
    changed = max((after[k] - before[k]).abs().max().item() for k in before)
    assert changed > 0
    if lora is not None:  # the base weights did not move; the reference is the adapter-free model
        with policy.reference() as ref:
            assert all(not p.requires_grad for n, p in ref.named_parameters() if "lora_" not in n)


def test_kl_is_zero_when_policy_is_reference() -> None:
    policy = fresh_policy(autocast=False)
    transitions = rollout_transitions(policy, n_tasks=2)
    for estimator in ("k1", "k2", "k3"):
        updater = PolicyUpdater(policy, UpdateConfig(lr=0.0, kl_coef=1.0, kl_estimator=estimator))
        metrics = updater.update(transitions)
        assert metrics.kl == 0.0


def test_on_policy_ratio_is_one_and_logprobs_agree() -> None:
    """Server logprobs == update logprobs: on policy nothing is clipped and the mismatch is ~0."""
    policy = fresh_policy(autocast=False)
    transitions = rollout_transitions(policy)
    updater = PolicyUpdater(policy, UpdateConfig(lr=1e-4, micro_batch_tokens=64))
    recomputed = updater.compute_logprobs(transitions)
    for t, lp in zip(transitions, recomputed, strict=True):
        assert lp == pytest.approx(t.response_logprobs, abs=1e-4)
    metrics = updater.update(transitions)
    assert metrics.logprob_mismatch < 1e-4
    assert metrics.clip_frac == 0.0
    assert metrics.ratio_mean == pytest.approx(1.0, abs=1e-4)


def test_position_ids_make_padding_irrelevant() -> None:
    """Batched logprobs (prompts left-padded, responses right-padded) equal one-by-one forwards."""
    policy = fresh_policy(autocast=False)
    tok = policy.tokenizer
    transitions = [
        Transition(rollout_id=f"r{i}", index=0, prompt_ids=tok(p)["input_ids"], response_ids=tok(r)["input_ids"])
        for i, (p, r) in enumerate([("Hi", " there friend"), ("A much longer prompt here", " ok"), ("x", " yz w")])
    ]
    updater = PolicyUpdater(policy, UpdateConfig(micro_batch_tokens=10_000))
    batched = updater.compute_logprobs(transitions)
    for t, lp in zip(transitions, batched, strict=True):
        ids = torch.tensor([t.prompt_ids + t.response_ids])
        with torch.no_grad():
            ref = torch.log_softmax(policy.model(input_ids=ids).logits[0, len(t.prompt_ids) - 1 : -1], -1)
        expected = ref.gather(1, torch.tensor(t.response_ids)[:, None]).squeeze(1)
        assert lp == pytest.approx(expected.tolist(), abs=1e-5)


def test_micro_batch_size_does_not_change_the_update() -> None:
    results = []
    for budget in (10_000, 40):
        policy = fresh_policy(autocast=False)
        transitions = rollout_transitions(policy)
        updater = PolicyUpdater(policy, UpdateConfig(lr=1e-3, micro_batch_tokens=budget))
        metrics = updater.update(transitions)
        results.append((trainable(policy), metrics))
    (a, ma), (b, mb) = results
    assert ma.micro_batches == 1 and mb.micro_batches > 3
    assert ma.loss == pytest.approx(mb.loss, abs=1e-5)
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5


def test_response_mask_and_validation() -> None:
    policy = fresh_policy(autocast=False)
    base = dict(rollout_id="r", index=0, prompt_ids=[5, 6, 7], response_ids=[8, 9], advantage=1.0)
    updater = PolicyUpdater(policy, UpdateConfig(lr=1e-3))
    metrics = updater.update([Transition(**base), Transition(**{**base, "rollout_id": "s", "response_mask": [0, 0]})])
    assert metrics.skipped == 1 and metrics.n_tokens == 2
    assert metrics.prompt_len_mean == 3 and metrics.response_len_mean == 2
    assert math.isnan(metrics.logprob_mismatch)  # no rollout logprobs given
    with pytest.raises(UserError, match="advantage"):
        updater.update([Transition(**{**base, "advantage": None})])
    with pytest.raises(UserError, match="logprobs"):
        updater.update([Transition(**{**base, "response_logprobs": [-1.0]})])
    with pytest.raises(UserError, match="trainable"):
        updater.update([Transition(**{**base, "response_mask": [0, 0]})])


def test_multiple_epochs_and_mini_batches_clip() -> None:
    policy = fresh_policy()
    transitions = rollout_transitions(policy)
    updater = PolicyUpdater(policy, UpdateConfig(lr=3e-3, epochs=2, mini_batches=2, clip_ratio_high=0.28))
    metrics = updater.update(transitions)
    assert metrics.optimizer_steps == 4
    assert metrics.clip_frac > 0  # later steps are off-policy and get clipped
    assert policy.version == 1


@pytest.mark.parametrize("lora", [None, LoraSettings(r=4, alpha=8)], ids=["full", "lora"])
def test_checkpoint_save_and_resume(tmp_path: Path, lora: LoraSettings | None) -> None:
    config = UpdateConfig(lr=1e-3, mini_batches=2)
    policy = fresh_policy(lora=lora, autocast=False)
    transitions = rollout_transitions(policy)
    updater = PolicyUpdater(policy, config)
    updater.update(transitions)
    ckpt = updater.save_checkpoint(tmp_path / "ckpt")
    assert (ckpt / ("adapter" if lora else "model")).is_dir()
    saved_weights = trainable(policy)
    saved_state = {k: {n: t.clone() for n, t in v.items()} for k, v in updater.optimizer.state_dict()["state"].items()}
    updater.update(transitions)
    expected_next = trainable(policy)

    resumed_policy = fresh_policy(lora=lora, autocast=False)
    resumed = PolicyUpdater(resumed_policy, config)
    resumed.load_checkpoint(ckpt)
    assert resumed.step == 1 and resumed_policy.version == 1
    restored = trainable(resumed_policy)
    assert all(torch.equal(restored[k], saved_weights[k]) for k in saved_weights)
    state = resumed.optimizer.state_dict()["state"]
    assert state.keys() == saved_state.keys()
    for k, v in saved_state.items():
        for name, tensor in v.items():
            assert torch.equal(state[k][name], tensor)
    # the resumed run continues exactly like the original (weights, optimizer and RNG restored)
    resumed.update(transitions)
    again = trainable(resumed_policy)
    assert max((again[k] - expected_next[k]).abs().max().item() for k in again) < 1e-6
    assert resumed_policy.version == 2


def test_checkpoint_kind_mismatch(tmp_path: Path) -> None:
    policy = fresh_policy()
    PolicyUpdater(policy).save_checkpoint(tmp_path / "full")
    lora_updater = PolicyUpdater(fresh_policy(lora=LoraSettings(r=2)))
    with pytest.raises(UserError, match="full-model"):
        lora_updater.load_checkpoint(tmp_path / "full")
    with pytest.raises(UserError, match="not an agentbolt-torch checkpoint"):
        lora_updater.load_checkpoint(tmp_path)


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_shared_weights_serve_the_update(autocast: bool) -> None:
    """The engine samples from the very parameters the updater changes (its bf16 casts are refreshed)."""
    policy = fresh_policy(autocast=autocast)
    transitions = rollout_transitions(policy, n_tasks=1)
    updater = PolicyUpdater(policy, UpdateConfig(lr=1e-2))
    tok = policy.tokenizer
    prompt = tok("shared?")["input_ids"]
    with GenerationEngine(policy, batch_window_s=0) as engine:
        before = engine.generate(prompt, SamplingParams(max_tokens=5, temperature=0), timeout=60)[0]
        assert (engine._cast is not None) == autocast and engine._prompts
        with engine.paused():
            # the update gets the memory of what depended on the old weights (cast copies, prompt cache)
            assert engine._cast is None and not engine._prompts and engine._prompts_bytes == 0
            updater.update(transitions)
        after = engine.generate(prompt, SamplingParams(max_tokens=5, temperature=0), timeout=60)[0]
    assert after.policy_version == before.policy_version + 1
    assert after.logprobs != before.logprobs
    # what the engine reports after the update is what the updater computes with the new weights
    fresh = Transition(rollout_id="x", index=0, prompt_ids=prompt, response_ids=after.token_ids)
    assert updater.compute_logprobs([fresh])[0] == pytest.approx(after.logprobs, abs=1e-4 if not autocast else 0.05)


@pytest.mark.parametrize("lora", [None, LoraSettings(r=4, alpha=8)], ids=["full", "lora"])
def test_gradient_checkpointing_gives_the_same_update(lora: LoraSettings | None) -> None:
    results = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        policy = fresh_policy(lora=lora, autocast=False)
        transitions = rollout_transitions(policy, n_tasks=1)
        updater = PolicyUpdater(policy, UpdateConfig(lr=1e-2, gradient_checkpointing=checkpointing))
        metrics = updater.update(transitions)
        assert metrics.grad_norm > 0
        results.append(trainable(policy))
    assert max((results[0][k] - results[1][k]).abs().max().item() for k in results[0]) < 1e-6


def group_transitions(policy: Policy, prompts: Sequence[str], group: int = 4) -> list[Transition]:
    """GRPO-shaped data: each prompt sampled ``group`` times (one rollout each), responses of varied length."""
    tok = policy.tokenizer
    rng = random.Random(1)
    out = []
    with GenerationEngine(policy, batch_window_s=0, seed=2) as engine:
        for task, text in enumerate(prompts):
            prompt = tok(text)["input_ids"]
            for g in range(group):
                params = SamplingParams(max_tokens=rng.randint(1, 12))
                completion = engine.generate(prompt, params, timeout=60)[0]
                out.append(
                    Transition(
                        rollout_id=f"t{task}-g{g}",
                        group_id=f"t{task}",
                        index=0,
                        prompt_ids=prompt,
                        response_ids=completion.token_ids,
                        response_logprobs=completion.logprobs,
                        advantage=rng.uniform(-1, 1),
                    )
                )
    return out


PROMPTS = ["What is 2 + 3?", "Add them: 17 and 25, then tell me", "x"]


@pytest.mark.parametrize(
    ("lora", "kl_coef"),
    [(None, 0.0), (None, 0.5), (LoraSettings(r=4, alpha=8), 0.5)],
    ids=["full", "full-kl", "lora-kl"],
)
def test_shared_prompts_give_the_same_logprobs_and_update(lora: LoraSettings | None, kl_coef: float) -> None:
    """One prompt pass per GRPO group + responses on its KV cache == one full sequence per transition."""
    results = []
    for share in (False, True):
        torch.manual_seed(0)
        policy = fresh_policy(lora=lora, autocast=False)
        transitions = group_transitions(policy, PROMPTS)
        # eps=1 makes AdamW's first step ~ -lr * grad (not lr * sign(grad)), so weights compare gradients
        config = UpdateConfig(lr=1.0, eps=1.0, kl_coef=kl_coef, share_prompts=share, micro_batch_tokens=10_000)
        updater = PolicyUpdater(policy, config)
        logprobs = updater.compute_logprobs(transitions)
        before = trainable(policy)
        metrics = updater.update(transitions)
        delta = {k: v - before[k] for k, v in trainable(policy).items()}
        results.append((logprobs, delta, metrics, transitions))
    (lp_a, w_a, m_a, transitions), (lp_b, w_b, m_b, _) = results
    for t, a, b in zip(transitions, lp_a, lp_b, strict=True):
        assert b == pytest.approx(a, abs=1e-5)
        assert b == pytest.approx(t.response_logprobs, abs=1e-4)  # and both equal the engine's
    assert m_b.loss == pytest.approx(m_a.loss, abs=1e-6)
    assert m_b.grad_norm == pytest.approx(m_a.grad_norm, rel=1e-4)
    assert m_b.kl == pytest.approx(m_a.kl, abs=1e-6)
    scale = max(v.abs().max().item() for v in w_a.values())
    assert scale > 1e-4
    assert max((w_a[k] - w_b[k]).abs().max().item() for k in w_a) < 1e-4 * scale
    # the shared pass processes each prompt once instead of once per sample
    prompt_tokens = sum(len(t.prompt_ids) for t in transitions)
    assert m_a.tokens_per_s * m_a.seconds - m_b.tokens_per_s * m_b.seconds == pytest.approx(
        prompt_tokens * 3 / 4, rel=1e-3
    )


def test_shared_prompt_micro_batches_count_each_prompt_once() -> None:
    policy = fresh_policy(autocast=False)
    long_prompts = [f"{' '.join(['word'] * 40)} question {i}?" for i in range(3)]  # prompts >> responses
    transitions = group_transitions(policy, long_prompts)
    longest = max(len(t.prompt_ids) + len(t.response_ids) for t in transitions)
    budget = 4 * longest  # one group's full sequences, or all three groups when their prompts are shared
    plain = PolicyUpdater(policy, UpdateConfig(lr=0.0, share_prompts=False, micro_batch_tokens=budget))
    shared = PolicyUpdater(policy, UpdateConfig(lr=0.0, micro_batch_tokens=budget))
    m_plain, m_shared = plain.update(transitions), shared.update(transitions)
    assert (m_plain.micro_batches, m_shared.micro_batches) == (3, 1)
    # and groups are never split across micro-batches needlessly: samples of one prompt stay together
    batches = shared._micro_batches(shared._prepare(transitions))
    for batch in batches:
        keys = [it.prompt_key for it in batch]
        assert keys == sorted(keys, key=keys.index)  # contiguous runs


def test_shared_prompts_with_one_token_responses() -> None:
    """Responses of one token need only the prompt pass (its last logits); empty ones are kept."""
    policy = fresh_policy(autocast=False)
    tok = policy.tokenizer
    prompt = tok("Shared prompt, short answers:")["input_ids"]
    transitions = [
        Transition(rollout_id=f"r{i}", index=0, prompt_ids=prompt, response_ids=response)
        for i, response in enumerate([[5], [9], [], [17]])
    ]
    shared = PolicyUpdater(policy, UpdateConfig()).compute_logprobs(transitions)
    plain = PolicyUpdater(policy, UpdateConfig(share_prompts=False)).compute_logprobs(transitions)
    assert [len(lp) for lp in shared] == [1, 1, 0, 1]
    for a, b in zip(shared, plain, strict=True):
        assert a == pytest.approx(b, abs=1e-5)


def test_off_policy_correction_uses_cores_rule_on_behaviour_vs_recomputed_logprobs() -> None:
    """Sync path: behaviour = the sampling logprobs, proximal = the updater's recomputed old logprobs."""
    policy = fresh_policy(autocast=False)
    transitions = rollout_transitions(policy)
    # half the rows look sampled by an older policy: their behaviour logprobs are 1 nat lower
    shifted = [
        t.model_copy(update={"response_logprobs": [x - 1.0 for x in t.response_logprobs]}) if i % 2 else t  # type: ignore[union-attr]
        for i, t in enumerate(transitions)
    ]
    correction = LightningRLConfig(
        rollout_is="token", rollout_is_threshold=1.5, rollout_rs="seq_mean_k1", rollout_rs_threshold="0.2_5.0"
    ).correction
    assert correction is not None
    updater = PolicyUpdater(policy, UpdateConfig(lr=1e-3), correction=correction)
    proximal = updater.compute_logprobs(shifted)
    expected = rollout_correction(
        [t.response_logprobs for t in shifted],  # type: ignore[misc]
        proximal,
        [[1] * len(t.response_ids) for t in shifted],
        correction,
    )
    metrics = updater.update(training_rows(shifted))
    assert metrics.is_weight_mean == pytest.approx(expected.stats["is_weight_mean"], rel=1e-6)
    assert metrics.is_weight_max == pytest.approx(1.5)  # e^1 ratios are capped
    assert metrics.is_clipped_frac == pytest.approx(expected.stats["is_clipped_frac"]) and metrics.is_clipped_frac > 0.3
    assert metrics.rs_masked_frac == expected.stats["rs_masked_frac"]
    assert policy.version == 1

    plain = PolicyUpdater(fresh_policy(autocast=False), UpdateConfig(lr=1e-3)).update(transitions)
    assert math.isnan(plain.is_weight_mean) and math.isnan(plain.rs_masked_frac)


def test_correction_refuses_ratios_against_the_sampling_policy_and_rows_without_logprobs() -> None:
    policy = fresh_policy(autocast=False)
    correction = LightningRLConfig(rollout_is="sequence").correction
    with pytest.raises(UserError, match="old_logprobs='rollout'"):
        PolicyUpdater(policy, UpdateConfig(old_logprobs="rollout"), correction=correction)
    updater = PolicyUpdater(policy, UpdateConfig(), correction=correction)
    bare = Transition(rollout_id="r", index=0, prompt_ids=[5, 6], response_ids=[7, 8], advantage=1.0)
    with pytest.raises(UserError, match="behaviour"):
        updater.update([bare])


@pytest.mark.parametrize(
    ("lora", "share", "checkpointing"),
    [
        (None, False, False),
        (None, True, False),
        (LoraSettings(r=4, alpha=8), True, False),
        (None, True, True),
        (LoraSettings(r=4, alpha=8), True, True),
    ],
    ids=["full", "full-shared", "lora-shared", "full-shared-checkpointing", "lora-shared-checkpointing"],
)
def test_chunked_output_head_gives_the_model_logits_update(
    monkeypatch: pytest.MonkeyPatch, lora: LoraSettings | None, share: bool, checkpointing: bool
) -> None:
    """Hidden states through the output head in recomputed chunks (a few positions each here) give
    the logprobs, entropies, losses and weight change of the model's own full logits."""
    from agentbolt_torch.update import forward as update_forward

    results = []
    for chunked in (False, True):
        with monkeypatch.context() as patch:
            if chunked:
                vocab = int(update_forward._output_head(fresh_policy().model).weight.shape[0])
                patch.setattr(update_forward, "LOGIT_CHUNK_BYTES", 4 * vocab * 3)  # 3 positions per chunk
            else:
                patch.setattr(update_forward, "_output_head", lambda model: None)  # the model's own logits
            torch.manual_seed(0)
            policy = fresh_policy(lora=lora, autocast=False)
            transitions = group_transitions(policy, PROMPTS)
            config = UpdateConfig(
                lr=1.0,
                eps=1.0,
                kl_coef=0.5,
                entropy_coef=0.1,
                logit_temperature=0.7,
                share_prompts=share,
                gradient_checkpointing=checkpointing,
                micro_batch_tokens=10_000,
            )
            updater = PolicyUpdater(policy, config)
            logprobs = updater.compute_logprobs(transitions)
            before = trainable(policy)
            metrics = updater.update(transitions)
            delta = {k: v - before[k] for k, v in trainable(policy).items()}
            results.append((logprobs, delta, metrics))
    (lp_a, w_a, m_a), (lp_b, w_b, m_b) = results
    for a, b in zip(lp_a, lp_b, strict=True):
        assert b == pytest.approx(a, abs=1e-5)
    for name in ("loss", "pg_loss", "kl", "entropy"):
        assert getattr(m_b, name) == pytest.approx(getattr(m_a, name), rel=1e-5, abs=1e-6), name
    assert m_b.grad_norm == pytest.approx(m_a.grad_norm, rel=1e-4)
    scale = max(v.abs().max().item() for v in w_a.values())
    assert scale > 1e-4
    assert max((w_a[k] - w_b[k]).abs().max().item() for k in w_a) < 1e-4 * scale


def test_output_head_is_used_only_when_logits_are_exactly_the_head() -> None:
    from agentbolt_torch.update import forward as update_forward

    policy = fresh_policy()
    assert update_forward._output_head(policy.model) is policy.model.get_output_embeddings()
    policy.model.config.final_logit_softcapping = 30.0  # Gemma-style soft-capping: the model's own logits
    assert update_forward._output_head(policy.model) is None


def test_updates_run_on_the_policys_one_training_thread() -> None:
    """Whatever thread calls update(), the work runs on one thread per policy (an allocator keeps a
    thread's freed memory for that thread, so varying threads each kept an update's activations)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    policy = fresh_policy(autocast=False)
    transitions = rollout_transitions(policy, n_tasks=1)
    updater = PolicyUpdater(policy, UpdateConfig(lr=1e-3))
    seen: list[int] = []
    original = updater._forward_backward

    def recording(*args: object, **kwargs: object) -> dict[str, float]:
        seen.append(threading.get_ident())
        return original(*args, **kwargs)  # type: ignore[arg-type]

    updater._forward_backward = recording  # type: ignore[method-assign]
    callers = [ThreadPoolExecutor(1) for _ in range(2)]
    for pool in callers:
        assert pool.submit(updater.update, transitions).result().optimizer_steps == 1
    updater.compute_logprobs(transitions[:1])
    for pool in callers:
        pool.shutdown()
    assert len(seen) >= 2 and len(set(seen)) == 1 and seen[0] != threading.get_ident()
    # a call from the training thread runs there directly (no deadlock), errors reach the caller
    assert policy.on_training_thread(lambda: policy.on_training_thread(threading.get_ident)) == seen[0]
    with pytest.raises(ZeroDivisionError):
        policy.on_training_thread(lambda: 1 / 0)
