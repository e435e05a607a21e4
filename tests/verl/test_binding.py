"""Layer 3 outside Ray: the agent loop, the rollout executor and the trainer hooks, with a real
in-memory store, a fake agentbolt runner, a fake gateway and a fake verl server manager."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import verl_helpers
from verl_helpers import FakeGateway, llm_span_transitions, tr

from agentbolt import semconv
from agentbolt.errors import SchemaError, UserError
from agentbolt.store.memory import MemoryStore
from agentbolt.types import (
    AttemptStatus,
    ErrorInfo,
    ErrorKind,
    Resources,
    RolloutMode,
    RolloutStatus,
    Span,
    Task,
)
from agentbolt_verl.batch import BatchOptions, build_batch
from agentbolt_verl.binding import coordinator as coord
from agentbolt_verl.binding import gateway as gw
from agentbolt_verl.binding.rollouts import (
    LocalMetricsSink,
    RolloutExecutor,
    RolloutRequest,
    decode_task_row,
    task_row,
)
from agentbolt_verl.config import RolloutSettings, compose_verl_config

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*engine is not available:UserWarning"),
    pytest.mark.filterwarnings("ignore:Ray state API:DeprecationWarning"),
]

OPTIONS = BatchOptions(max_prompt_length=16, max_response_length=4, logprobs="require")


@pytest.fixture
async def store():
    s = MemoryStore(sweep_interval_s=0.05)
    yield s
    await s.close()


async def fake_runner(store, *, n=1, calls=2, reward=1.0, fail=False, policy_version=None, response_len=3):
    """Claim ``n`` rollouts and play an agent: ``calls`` gateway LLM-call spans, then finish."""
    done = 0
    while done < n:
        for claim in await store.dequeue("runner-1", limit=n, wait_s=5.0):
            rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
            spans = []
            for k in range(calls):
                prompt = [100 + k, 101, 102] + [7] * k
                attrs = {
                    semconv.GEN_AI_OPERATION_NAME: semconv.OP_CHAT,
                    semconv.PROMPT_TOKEN_IDS: prompt,
                    semconv.RESPONSE_TOKEN_IDS: [200 + j for j in range(response_len)],
                    semconv.RESPONSE_LOGPROBS: [-0.5] * response_len,
                    semconv.TOKEN_SOURCE: "exact",
                }
                if policy_version is not None:
                    attrs[semconv.POLICY_VERSION] = policy_version
                spans.append(Span.create(semconv.SPAN_LLM_CALL, rollout_id=rid, attempt_id=aid, attributes=attrs))
            await store.add_spans(spans)
            if fail:
                error = ErrorInfo(kind=ErrorKind.AGENT, type="ValueError", message="agent crashed")
                await store.finish_attempt(aid, AttemptStatus.FAILED, error=error)
            else:
                await store.finish_attempt(aid, AttemptStatus.SUCCEEDED, reward=reward)
            done += 1


def request(uid="u1", session=0, **kw) -> RolloutRequest:
    return RolloutRequest(uid=uid, session_id=session, task_id="t1", input={"q": 1}, global_steps=5, **kw)


async def test_executor_runs_a_session_as_a_rollout(store) -> None:
    resources = await store.add_resources(Resources(extra={"verl_weights_version": 4}))
    sink = LocalMetricsSink()
    executor = RolloutExecutor(store, llm_span_transitions, OPTIONS, sink=sink)
    result, _ = await asyncio.gather(
        executor.run(request(sampling={"temperature": 0.7})),
        fake_runner(store, reward=0.75, policy_version=resources.version),
    )
    assert result.outcome == "trained" and result.rollout.status == RolloutStatus.SUCCEEDED
    rollout = result.rollout
    assert rollout.rollout_id == "verl-u1-0" and rollout.group_id == "u1" and rollout.task_id == "t1"
    assert rollout.metadata["verl"] == {"uid": "u1", "session_id": 0, "global_steps": 5}
    assert rollout.metadata["sampling"] == {"temperature": 0.7}
    assert len(result.outputs) == 2
    first, second = result.outputs
    assert first["prompt_ids"] == [100, 101, 102] and second["prompt_ids"] == [101, 101, 102, 7]
    assert first["response_ids"] == [200, 201, 202] and first["response_mask"] == [1, 1, 1]
    assert first["response_logprobs"] == [-0.5] * 3
    # calls without a reward take the rollout's final reward (counted)
    assert first["reward_score"] == second["reward_score"] == 0.75
    extra = second["extra_fields"]
    assert extra["reward_extra_info"] == {}
    assert (extra["min_global_steps"], extra["max_global_steps"]) == (4, 4)  # from the resources
    assert extra["agentbolt"]["rollout_id"] == "verl-u1-0" and extra["agentbolt"]["index"] == 1
    counts = sink.drain()
    assert counts["agentbolt/rollouts/rollouts"] == 1 and counts["agentbolt/rollouts/calls"] == 2
    assert counts["agentbolt/rollouts/rewards_from_rollout"] == 2
    assert counts["agentbolt/rollouts/batch/rows"] == 2
    assert sink.drain() == {}


async def test_a_reissued_session_reuses_its_rollout(store) -> None:
    executor = RolloutExecutor(store, llm_span_transitions, OPTIONS)
    first, _ = await asyncio.gather(executor.run(request()), fake_runner(store, calls=1))
    again = await asyncio.wait_for(executor.run(request()), timeout=5)  # no runner: already finished
    assert again.rollout.rollout_id == first.rollout.rollout_id and again.outputs == first.outputs
    assert again.rollout.attempt_count == 1
    # weights version unknown (no policy version on the spans): verl's step - 1
    assert first.outputs[0]["extra_fields"]["min_global_steps"] == 4


@pytest.mark.parametrize("policy", ["drop", "reward"])
async def test_failed_rollouts_are_dropped_or_rewarded(store, policy) -> None:
    sink = LocalMetricsSink()
    settings = RolloutSettings(on_failure=policy, failure_reward=-1.0)
    executor = RolloutExecutor(store, llm_span_transitions, OPTIONS, rollout=settings, sink=sink)
    result, _ = await asyncio.gather(executor.run(request()), fake_runner(store, fail=True))
    assert result.outcome == "failed" and result.rollout.status == RolloutStatus.FAILED
    counts = sink.drain()
    assert counts["agentbolt/rollouts/failed"] == 1
    if policy == "drop":
        assert result.outputs == [] and counts["agentbolt/rollouts/dropped_failed"] == 1
    else:
        assert [o["reward_score"] for o in result.outputs] == [-1.0, -1.0]
        assert counts["agentbolt/rollouts/failure_rewarded_calls"] == 2


async def test_wait_timeout_cancels_the_rollout(store) -> None:
    sink = LocalMetricsSink()
    executor = RolloutExecutor(
        store, llm_span_transitions, OPTIONS, rollout=RolloutSettings(wait_timeout_s=0.2), sink=sink
    )
    result = await executor.run(request())
    assert result.outcome == "timed_out" and result.rollout.status == RolloutStatus.CANCELLED
    assert result.outputs == [] and sink.drain()["agentbolt/rollouts/timed_out"] == 1


async def test_batch_rules_apply_per_rollout_and_are_counted(store) -> None:
    sink = LocalMetricsSink()
    executor = RolloutExecutor(store, llm_span_transitions, OPTIONS, sink=sink)
    result, _ = await asyncio.gather(executor.run(request()), fake_runner(store, response_len=6))
    assert [len(o["response_ids"]) for o in result.outputs] == [4, 4]  # truncated to 4
    assert sink.drain()["agentbolt/rollouts/batch/truncated_response"] == 2


async def test_transitions_of_other_rollouts_are_rejected(store) -> None:
    def wrong(rollouts, spans):
        return [tr("someone-else")]

    executor = RolloutExecutor(store, wrong, OPTIONS)
    with pytest.raises(SchemaError, match="other rollouts"):
        await asyncio.gather(executor.run(request()), fake_runner(store, calls=1))


def verl_row(task: Task, uid: str, session: int, mode=RolloutMode.TRAIN) -> dict:
    """The keyword arguments verl's V1 AgentLoopWorkerTQ passes to AgentLoopBase.run."""
    row = task_row(task, mode=mode, index=3)
    row.pop("agent_name")  # consumed by _run_agent_loop
    row.update(raw_prompt=row["prompt"], index=3, tools_kwargs={}, interaction_kwargs={})
    row.update(uid=uid, session_id=np.int64(session), global_steps=np.int64(2))
    return row


async def test_agent_loop_is_driven_like_verl_does(store) -> None:
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, DictConfigWrap, ToolListWrap

    from agentbolt_verl.config import agent_loop_config_path

    cfg = compose_verl_config({"agentbolt": {"store_url": "memory://"}})
    [entry] = OmegaConf.load(agent_loop_config_path())
    assert entry.name == cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "agentbolt"
    executor = RolloutExecutor(store, llm_span_transitions, OPTIONS)
    # as verl/experimental/agent_loop/agent_loop.py _run_agent_loop instantiates it
    loop = hydra.utils.instantiate(
        config=entry,
        trainer_config=DictConfigWrap(config=cfg),
        server_manager=SimpleNamespace(name="fake LLMServerClient (unused: agents call the gateway)"),
        tokenizer=SimpleNamespace(pad_token_id=0, eos_token_id=1),
        processor=None,
        hf_model_type=None,
        dataset_cls=object,
        data_config=DictConfigWrap(cfg.data),
        tools=ToolListWrap([]),
        executor=executor,
    )
    task = Task(task_id="t9", input={"question": "2+2"})
    outputs, _ = await asyncio.gather(
        loop.run({"temperature": 1.0, "top_p": 1.0, "logprobs": True}, **verl_row(task, "uid-7", 1)),
        fake_runner(store, reward=1.0),
    )
    assert all(isinstance(o, AgentLoopOutput) for o in outputs) and len(outputs) == 2
    [rollout] = await store.get_rollouts(["verl-uid-7-1"])
    assert rollout.task_id == "t9" and rollout.input == {"question": "2+2"} and rollout.group_id == "uid-7"
    # what verl's AgentLoopWorkerTQ._agent_loop_postprocess then does with them
    final = outputs[-1]
    for o in outputs[:-1]:
        o.reward_score = final.reward_score
        o.extra_fields["reward_extra_info"] = final.extra_fields["reward_extra_info"]
    fields = [o.as_dict() for o in outputs]
    assert fields[0]["rm_scores"].tolist() == [0.0, 0.0, 1.0]
    assert torch.equal(fields[1]["rollout_log_probs"], torch.full((3,), -0.5))
    assert np.array([f["extra_fields"]["min_global_steps"] for f in fields], dtype=int).tolist() == [1, 1]
    assert outputs[0].metrics.generate_sequences > 0


def test_shared_executor_is_built_from_the_composed_config() -> None:
    from agentbolt_verl.binding import agent_loop

    cfg = compose_verl_config(
        {
            "agentbolt": {"store_url": "memory://", "transitions": "verl_helpers:llm_span_transitions_factory"},
            "verl": {"actor_rollout_ref.rollout.calculate_log_probs": False, "data.max_response_length": 64},
        }
    )
    executor = agent_loop.shared_executor(cfg)
    assert executor is agent_loop.shared_executor(cfg)
    assert executor.spans_to_transitions is llm_span_transitions
    assert executor.options.logprobs == "ignore" and executor.options.max_response_length == 64
    assert executor.store.url == "memory://"


def test_task_files_are_read_by_verls_dataset(tmp_path) -> None:
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from agentbolt_verl.binding.entrypoint import prepare

    tasks_file = tmp_path / "tasks.jsonl"
    tasks = [Task(task_id="a", input={"x": [1, 2]}, metadata={"gold": 3}), Task(task_id="b", input="text")]
    tasks_file.write_text("\n".join(t.model_dump_json() for t in tasks))
    config = {
        "agentbolt": {
            "store_url": "memory://",
            "gateway": {"url": "http://gw:8100/v1", "control": "verl_helpers:make_fake_gateway"},
            "data": {"train": str(tasks_file), "workdir": str(tmp_path / "work")},
        },
        "verl": {"data.train_batch_size": 2},
    }
    cfg = prepare(config)
    assert cfg.data.train_files == cfg.data.val_files == str(tmp_path / "work" / "train.parquet")
    ds = RLHFDataset(
        data_files=[cfg.data.train_files],
        tokenizer=None,
        config=OmegaConf.create({"filter_overlong_prompts": False, "dataloader_num_workers": 0}),
        processor=None,
    )
    row = dict(ds[0])
    assert row["agent_name"] == "agentbolt" and row["raw_prompt"][0]["role"] == "user"
    assert decode_task_row(row) == {"task_id": "a", "input": {"x": [1, 2]}, "metadata": {"gold": 3}, "mode": "train"}
    row.update(uid="u", session_id=0, global_steps=1)
    req = RolloutRequest.from_verl_row(row, {"temperature": 1.0})
    assert (req.task_id, req.input, req.metadata, req.rollout_id) == ("a", {"x": [1, 2]}, {"gold": 3}, "verl-u-0")
    with pytest.raises(UserError, match=r"gateway\.url and agentbolt\.gateway\.control"):
        prepare({"agentbolt": {"store_url": "memory://"}})


def test_rows_without_a_task_are_rejected() -> None:
    with pytest.raises(SchemaError, match=r"extra_info\.agentbolt"):
        RolloutRequest.from_verl_row({"uid": "u", "session_id": 0, "extra_info": {"index": 0}})
    with pytest.raises(SchemaError, match=r"trainer\.use_v1"):
        RolloutRequest.from_verl_row({"uid": "u"})


# -- the trainer side --------------------------------------------------------------------------


class FakeVerlTrainer:
    """The parts of verl's PPOTrainerSync the mixin builds on (see verl/trainer/ppo/v1/)."""

    def __init__(self, cfg, rows) -> None:
        self.config = cfg
        self.rows = rows  # the batch in TransferQueue, in batch.keys order
        self.global_steps = 0
        self.llm_server_manager = SimpleNamespace(get_addresses=lambda: ["10.0.0.1:8000", "[fd00::1]:8001"])
        self.checkpoint_manager = SimpleNamespace(abort_replicas=lambda: verl_helpers.LOG.append("abort_replicas"))

    def on_init_end(self):
        verl_helpers.LOG.append("update_weights")

    def on_sample_end(self):
        verl_helpers.LOG.append("sleep_replicas")

    def on_step_end(self):
        verl_helpers.LOG.append("update_weights")

    def on_train_end(self):
        verl_helpers.LOG.append("train_end")

    def _compute_advantage(self, batch, metrics):
        # V1: rows fetched in batch.keys order → compute_advantage_for_multi_trajectories, which
        # hands non-GRPO estimators to ray_trainer.compute_advantage
        from verl.trainer.ppo.ray_trainer import compute_advantage

        from agentbolt_verl.to_verl import to_dataproto

        data = to_dataproto(self.rows)
        data.batch["token_level_rewards"] = data.batch["token_level_scores"]
        return compute_advantage(data, adv_estimator=self.config.algorithm.adv_estimator, config=self.config.algorithm)

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        metrics["verl/own"] = 1.0


class Trainer(coord.AgentboltTrainerMixin, FakeVerlTrainer):
    pass


def trainer_config(**gateway):
    return compose_verl_config(
        {
            "agentbolt": {
                "store_url": "memory://",
                "gateway": {"url": "http://gw:8100/v1", "control": "verl_helpers:make_fake_gateway", **gateway},
            },
            "verl": {"actor_rollout_ref.rollout.temperature": 0.8},
        }
    )


def test_gateway_follows_verls_weight_syncs() -> None:
    verl_helpers.LOG.clear()
    trainer = Trainer(trainer_config(), rows=None)
    log = verl_helpers.LOG
    trainer.on_init_end()
    gateway = verl_helpers.GATEWAYS[-1]
    assert gateway.url == "http://gw:8100/v1"
    assert log == ["update_weights", "set_upstreams", "resume"]
    assert gateway.upstreams == ["http://10.0.0.1:8000/v1", "http://[fd00::1]:8001/v1"]
    coordinator = trainer._agentbolt_coordinator
    first = trainer._agentbolt_run(coordinator.store.get_resources())
    assert first.extra["verl_weights_version"] == 0
    assert first.llm.base_url == "http://gw:8100/v1" and first.llm.sampling["temperature"] == 0.8
    assert first.llm.sampling["max_tokens"] == trainer.config.actor_rollout_ref.rollout.response_length

    log.clear()
    trainer.on_sample_end()  # replicas go to sleep: the gateway pauses and drains first
    assert log == ["pause", "drain", "sleep_replicas"] and gateway.paused
    log.clear()
    trainer.global_steps = 1
    trainer.on_step_end()  # new weights: publish a new version, resume (upstreams unchanged)
    assert log == ["update_weights", "resume"] and not gateway.paused
    latest = trainer._agentbolt_run(coordinator.store.get_resources())
    assert latest.version == first.version + 1 and latest.extra["verl_weights_version"] == 1

    gateway.drains = False
    log.clear()
    trainer.on_sample_end()  # a call still in flight after drain_timeout_s: abort, then sleep
    assert log == ["pause", "drain", "abort_replicas", "sleep_replicas"]
    metrics: dict = {}
    trainer._compute_metrics(None, metrics, {}, global_steps=1, epoch=0)
    assert metrics["agentbolt/gateway/drain_timeouts"] == 1.0 and metrics["verl/own"] == 1.0
    run = trainer._agentbolt_run(coordinator.store.get_run(coordinator.run_id))  # recorded for the dashboard
    assert (run.algorithm, run.steps, run.latest["verl/own"]) == ("verl", 1, 1.0)
    assert run.config["store_url"] == "memory://"
    trainer.on_train_end()
    assert log[-1] == "train_end" and trainer._agentbolt_bridge._loop is None


def test_advantages_get_rollout_membership_from_verls_keys() -> None:
    from agentbolt_verl.advantage import compute_rollout_advantage

    transitions = [
        tr("g1_0", 0, reward=1.0, group="g1"),
        tr("g1_0", 1, reward=1.0, group="g1"),
        tr("g1_0", 2, reward=1.0, group="g1"),
        tr("g1_1", 0, reward=0.0, group="g1"),
        tr("g2_0", 0, reward=0.5, group="g2"),  # alone in its group
    ]
    rows = build_batch(transitions, BatchOptions(max_prompt_length=8, max_response_length=8))
    keys = [f"{t.rollout_id}_{t.index}" for t in transitions]  # verl V1: {uid}_{session}_{index}
    trainer = Trainer(trainer_config(), rows=rows)
    trainer._agentbolt_sink = LocalMetricsSink()
    trainer._agentbolt_sink.add({"agentbolt/rollouts/calls": 5})
    metrics: dict = {}
    out = trainer._compute_advantage(SimpleNamespace(keys=keys), metrics)
    expected, _, _ = compute_rollout_advantage(
        rows.tensors["token_level_scores"],
        rows.tensors["response_mask"],
        rows.non_tensors["uid"],
        rows.non_tensors["rollout_id"],
        rows.non_tensors["transition_index"],
        singleton_groups="zero",
        aggregation="rollout-mean-token-mean",
    )
    assert (out.batch["advantages"] - expected).abs().max().item() <= 1e-6
    assert out.batch["advantages"][4].abs().sum() == 0  # singleton group → 0
    assert metrics["agentbolt/advantage/rollouts"] == 3 and metrics["agentbolt/advantage/singleton_groups"] == 1
    trainer._compute_metrics(None, metrics, {}, global_steps=1, epoch=0)
    assert metrics["agentbolt/rollouts/calls"] == 5


def test_upstream_urls_and_control_loading() -> None:
    assert gw.upstream_urls(["1.2.3.4:80", "http://h:1/v1", "[::1]:9/"]) == [
        "http://1.2.3.4:80/v1",
        "http://h:1/v1",
        "http://[::1]:9/v1",
    ]
    assert isinstance(gw.make_gateway_control("verl_helpers:make_fake_gateway", url="u"), gw.GatewayControl)
    assert isinstance(FakeGateway(), gw.GatewayControl)
    # the control the example config names: agentbolt's HTTP client of `agentbolt gateway serve`
    real = gw.make_gateway_control("agentbolt.gateway:GatewayClient", url="http://127.0.0.1:8100/v1")
    assert isinstance(real, gw.GatewayControl) and real.url == "http://127.0.0.1:8100"
    with pytest.raises(UserError, match=r"agentbolt\.gateway\.control is not set"):
        gw.make_gateway_control(None, url=None)
    with pytest.raises(UserError, match="lacks set_upstreams"):
        gw.make_gateway_control("types:SimpleNamespace", url="u")
    with pytest.raises(UserError, match="has no attribute"):
        gw.load_object("json:nope")
    assert gw.load_object("json.dumps") is json.dumps


def test_entrypoint_dry_run(tmp_path, capsys) -> None:
    from agentbolt_verl.binding.entrypoint import main

    tasks = tmp_path / "t.jsonl"
    tasks.write_text(Task(task_id="a").model_dump_json() + "\n")
    path = tmp_path / "train.yaml"
    path.write_text(
        f"agentbolt:\n  store_url: memory://\n  gateway: {{url: 'http://gw/v1', control: 'verl_helpers:make_fake_gateway'}}\n"
        f"  data: {{train: '{tasks}', workdir: '{tmp_path / 'w'}'}}\nverl:\n  data.train_batch_size: 1\n"
    )
    assert main(["train", str(path), "--dry-run", "-o", "trainer.total_training_steps=2"]) == 0
    out = capsys.readouterr().out
    assert "trainer_mode: agentbolt_sync" in out and "total_training_steps: 2" in out
    assert main(["train", str(tmp_path / "missing.yaml")]) == 2


async def test_default_extraction_is_agentbolts_lightningrl(store) -> None:
    """The default ``spans_to_transitions`` (LightningRL) on gateway-shaped spans."""
    from agentbolt_verl.binding.rollouts import lightningrl_transitions

    executor = RolloutExecutor(store, lightningrl_transitions(), OPTIONS)
    result, _ = await asyncio.gather(executor.run(request()), fake_runner(store, reward=0.5, calls=2))
    assert result.outcome == "trained"
    assert [t.prompt_ids for t in result.transitions] == [[100, 101, 102], [101, 101, 102, 7]]
    assert [o["reward_score"] for o in result.outputs] == [0.5, 0.5]
