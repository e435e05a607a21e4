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
from verl_helpers import FakeGateway, tr

from agentbolt import semconv
from agentbolt.errors import SchemaError, UserError
from agentbolt.lightningrl import LightningRL, LightningRLConfig
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
from agentbolt_verl.batch import pack_transitions
from agentbolt_verl.binding import coordinator as coord
from agentbolt_verl.binding import gateway as gw
from agentbolt_verl.binding.rollouts import (
    LocalMetricsSink,
    RolloutExecutor,
    RolloutRequest,
    decode_task_row,
    task_row,
)
from agentbolt_verl.columns import VerlColumns, row_extra
from agentbolt_verl.config import RolloutSettings, compose_verl_config

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*engine is not available:UserWarning"),
    pytest.mark.filterwarnings("ignore:Ray state API:DeprecationWarning"),
]


@pytest.fixture
async def store():
    s = MemoryStore(sweep_interval_s=0.05)
    yield s
    await s.close()


async def fake_runner(
    store, *, n=1, calls=2, reward=1.0, fail=False, policy_version=None, response_len=3, logprobs=True
):
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
                    semconv.TOKEN_SOURCE: "exact",
                }
                if logprobs:
                    attrs[semconv.RESPONSE_LOGPROBS] = [-0.5] * response_len
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


async def test_executor_runs_a_session_through_lightningrls_per_rollout_step(store) -> None:
    resources = await store.add_resources(Resources(extra={"verl_weights_version": 4}))
    sink = LocalMetricsSink()
    executor = RolloutExecutor(store, LightningRLConfig(credit="discounted", credit_options={"gamma": 0.5}), sink=sink)
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
    # verl's reward column gets the episode return; each row's own credit (discounted) travels with it
    assert first["reward_score"] == second["reward_score"] == 0.75
    assert [o["extra_fields"]["agentbolt"]["reward"] for o in result.outputs] == [0.375, 0.75]
    assert [t.reward for t in result.transitions] == [0.375, 0.75]
    extra = second["extra_fields"]
    assert extra["reward_extra_info"] == {}
    assert (extra["min_global_steps"], extra["max_global_steps"]) == (4, 4)  # from the resources
    assert extra["agentbolt"] == {
        "rollout_id": "verl-u1-0",
        "group_id": "u1",
        "index": 1,
        "agent_name": None,
        "reward": 0.75,
        "policy_version": 4,  # verl's weight version of the call
        "resources_version": resources.version,
        "span_id": result.transitions[1].span_id,
        "merged_indices": None,
    }
    counts = sink.drain()
    assert counts["agentbolt/rollouts/rollouts"] == 1 and counts["agentbolt/rollouts/calls"] == 2
    assert counts["agentbolt/rollouts/transitions"] == 2
    assert sink.drain() == {}


async def test_a_reissued_session_reuses_its_rollout(store) -> None:
    executor = RolloutExecutor(store)
    first, _ = await asyncio.gather(executor.run(request()), fake_runner(store, calls=1))
    again = await asyncio.wait_for(executor.run(request()), timeout=5)  # no runner: already finished
    assert again.rollout.rollout_id == first.rollout.rollout_id and again.outputs == first.outputs
    assert again.rollout.attempt_count == 1
    # weights version unknown (no policy version on the spans): verl's step - 1
    assert first.outputs[0]["extra_fields"]["min_global_steps"] == 4


async def test_a_failed_rollout_goes_through_lightningrl_like_any_other(store) -> None:
    """No verl-side failure rule: without a return its calls are LightningRL's missing_reward."""
    sink = LocalMetricsSink()
    executor = RolloutExecutor(store, sink=sink)
    result, _ = await asyncio.gather(executor.run(request()), fake_runner(store, fail=True))
    assert result.outcome == "failed" and result.rollout.status == RolloutStatus.FAILED
    assert result.outputs == []
    counts = sink.drain()
    assert counts["agentbolt/rollouts/failed"] == 1 and counts["agentbolt/rollouts/excluded/missing_reward"] == 2
    filled = RolloutExecutor(store, LightningRLConfig(missing_reward="fill", fill_value=-1.0))
    again = await asyncio.wait_for(filled.run(request()), timeout=5)
    assert [o["extra_fields"]["agentbolt"]["reward"] for o in again.outputs] == [-1.0, -1.0]


async def test_wait_timeout_cancels_the_rollout(store) -> None:
    sink = LocalMetricsSink()
    executor = RolloutExecutor(store, rollout=RolloutSettings(wait_timeout_s=0.2), sink=sink)
    result = await executor.run(request())
    assert result.outcome == "timed_out" and result.rollout.status == RolloutStatus.CANCELLED
    assert result.outputs == [] and sink.drain()["agentbolt/rollouts/timed_out"] == 1


async def test_lightningrls_rules_apply_per_rollout_and_are_counted(store) -> None:
    sink = LocalMetricsSink()
    executor = RolloutExecutor(store, LightningRLConfig(max_response_length=4), sink=sink)
    result, _ = await asyncio.gather(executor.run(request()), fake_runner(store, response_len=6))
    assert result.outputs == [] and result.outcome == "empty"
    assert sink.drain()["agentbolt/rollouts/excluded/over_length"] == 2


async def test_calls_without_logprobs_are_not_packed_when_verl_reads_them(store) -> None:
    sink = LocalMetricsSink()
    executor = RolloutExecutor(store, need_logprobs=True, sink=sink)
    result, _ = await asyncio.gather(executor.run(request()), fake_runner(store, logprobs=False))
    assert result.outputs == [] and sink.drain()["agentbolt/rollouts/dropped_no_logprobs"] == 2
    lenient = RolloutExecutor(store, need_logprobs=False)
    again = await asyncio.wait_for(lenient.run(request()), timeout=5)
    assert [o["response_logprobs"] for o in again.outputs] == [None, None]


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
    executor = RolloutExecutor(store)
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
            "agentbolt": {"store_url": "memory://", "lightningrl": {"credit": "discounted"}},
            "verl": {"actor_rollout_ref.rollout.calculate_log_probs": False, "data.max_response_length": 64},
        }
    )
    executor = agent_loop.shared_executor(cfg)
    assert executor is agent_loop.shared_executor(cfg)
    config = executor.lightningrl.config
    assert config.credit == "discounted" and config.max_response_length == 64 and config.allow_empty
    assert executor.need_logprobs is False
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

    def __init__(self, cfg) -> None:
        self.config = cfg
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
        raise AssertionError("verl's own advantage step must not run")

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        metrics["verl/own"] = 1.0


class Trainer(coord.AgentboltTrainerMixin, FakeVerlTrainer):
    """The binding's trainer over a fake TransferQueue: the batch's fields in, the columns out."""

    fields: coord.BatchFields | None = None
    written: VerlColumns | None = None

    def _agentbolt_read_batch(self, batch):
        return self.fields

    def _agentbolt_write_columns(self, batch, columns):
        self.written = columns


def trainer_config(lightningrl=None, **gateway):
    return compose_verl_config(
        {
            "agentbolt": {
                "store_url": "memory://",
                "gateway": {"url": "http://gw:8100/v1", "control": "verl_helpers:make_fake_gateway", **gateway},
                "lightningrl": lightningrl or {},
            },
            "verl": {"actor_rollout_ref.rollout.temperature": 0.8},
        }
    )


def test_gateway_follows_verls_weight_syncs() -> None:
    verl_helpers.LOG.clear()
    trainer = Trainer(trainer_config())
    log = verl_helpers.LOG
    trainer.on_init_end()
    gateway = verl_helpers.GATEWAYS[-1]
    assert gateway.url == "http://gw:8100/v1"
    assert log == ["update_weights", "set_upstreams", "set_policy", "resume"]
    assert gateway.upstreams == ["http://10.0.0.1:8000/v1", "http://[fd00::1]:8001/v1"]
    coordinator = trainer._agentbolt_coordinator
    first = trainer._agentbolt_run(coordinator.store.get_resources())
    assert first.extra["verl_weights_version"] == 0
    assert gateway.policy_version == first.version  # spans record the version that served each call
    assert first.llm.base_url == "http://gw:8100/v1" and first.llm.sampling["temperature"] == 0.8
    assert first.llm.sampling["max_tokens"] == trainer.config.actor_rollout_ref.rollout.response_length

    log.clear()
    trainer.on_sample_end()  # replicas go to sleep: the gateway pauses and drains first
    assert log == ["pause", "drain", "sleep_replicas"] and gateway.paused
    log.clear()
    trainer.global_steps = 1
    trainer.on_step_end()  # new weights: publish a new version, resume (upstreams unchanged)
    assert log == ["update_weights", "set_policy", "resume"] and not gateway.paused
    latest = trainer._agentbolt_run(coordinator.store.get_resources())
    assert latest.version == first.version + 1 and latest.extra["verl_weights_version"] == 1
    assert gateway.policy_version == latest.version

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


def _fields(transitions, versions, *, pad: int = 0) -> coord.BatchFields:
    """A verl batch as TransferQueue holds it: rows written by the agent loop, then verl's padding."""
    packed = pack_transitions(transitions)
    extras = [row_extra(t, v) for t, v in zip(transitions, versions, strict=True)]
    mask = packed.tensors["response_mask"]
    if pad:  # verl's padding rows copy the first row's fields; the tags say they are padding
        mask = torch.cat([mask, torch.zeros((pad, mask.shape[1]), dtype=mask.dtype)])
    return coord.BatchFields(
        extras=[*extras, *([None] * pad)],
        prompts=[t.prompt_ids for t in transitions] + [transitions[0].prompt_ids] * pad,
        responses=[t.response_ids for t in transitions] + [transitions[0].response_ids] * pad,
        response_mask=mask,
    )


def test_the_advantage_step_is_lightningrls() -> None:
    transitions = [
        tr("g1_0", 0, reward=1.0, group="g1"),
        tr("g1_0", 1, reward=1.0, group="g1"),
        tr("g1_0", 2, reward=1.0, group="g1"),
        tr("g1_1", 0, reward=0.0, group="g1"),
        tr("g2_0", 0, reward=0.5, group="g2"),  # alone in its group
    ]
    trainer = Trainer(trainer_config())
    trainer.global_steps = 3
    trainer.fields = _fields(transitions, [2] * 5, pad=3)
    trainer._agentbolt_sink = LocalMetricsSink()
    trainer._agentbolt_sink.add({"agentbolt/rollouts/calls": 5})
    metrics: dict = {}
    batch = SimpleNamespace(keys=[f"k{i}" for i in range(8)])
    assert trainer._compute_advantage(batch, metrics) is batch
    columns = trainer.written
    expected = LightningRL().to_rows(transitions).rows  # the same rows a torch step trains
    b = 8
    for i, row in enumerate(expected):
        assert columns.advantages[i, :2].tolist() == pytest.approx([row.advantage] * 2)
        assert columns.loss_weight[i, :2].tolist() == pytest.approx([row.loss_weight * b] * 2)
    assert columns.advantages[4].abs().sum() == 0  # a singleton group: advantage 0
    assert columns.loss_weight[5:].abs().sum() == 0 and columns.response_mask[5:].sum() == 0  # padding rows
    assert metrics["agentbolt/lightningrl/transitions"] == 5.0
    assert metrics["agentbolt/lightningrl/staleness/0"] == 5.0  # trained version = global_steps - 1
    trainer._compute_metrics(None, metrics, {}, global_steps=1, epoch=0)
    assert metrics["agentbolt/rollouts/calls"] == 5


def test_the_advantage_step_drops_stale_rows_and_corrects_with_verls_old_log_probs() -> None:
    transitions = [tr(f"r{i}", 0, reward=float(i % 2), group="g") for i in range(4)]
    lightningrl = {"max_staleness": 1, "rollout_is": "token", "rollout_is_threshold": 1.5}
    trainer = Trainer(trainer_config(lightningrl))
    trainer.global_steps = 5  # training version 4: version 2 is 2 behind
    fields = _fields(transitions, [4, 3, 2, 4])
    behaviour = pack_transitions(transitions).tensors["rollout_log_probs"]
    fields.rollout_log_probs = behaviour
    fields.old_log_probs = behaviour + torch.tensor([[0.0, 1.0]])  # second token: ratio e > 1.5
    trainer.fields = fields
    metrics: dict = {}
    trainer._compute_advantage(SimpleNamespace(keys=list("abcd")), metrics)
    columns = trainer.written
    assert columns.response_mask.tolist() == [[1, 1], [1, 1], [0, 0], [1, 1]]
    assert columns.loss_weight[2].abs().sum() == 0 and columns.advantages[2].abs().sum() == 0
    assert metrics["agentbolt/lightningrl/excluded/stale"] == 1.0
    # rollout-mean-token-mean over 3 rollouts of 2 tokens, times 4 rows, times the IS weight
    assert columns.loss_weight[0].tolist() == pytest.approx([4 / 6 * 1.0, 4 / 6 * 1.5])
    assert metrics["agentbolt/correction/is_clipped_frac"] == pytest.approx(0.5)


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


@pytest.mark.parametrize("policy_version", [0, 99])
async def test_a_call_of_weights_the_store_never_published_is_trained_as_unknown_version(
    store, policy_version: int
) -> None:
    """``policy_version=0`` (agentbolt-torch's initial weights) or a version the store lacks: the
    rollout still trains; the call's verl weight version is unknown and counted as such."""
    await store.add_resources(Resources(extra={"verl_weights_version": 4}))
    sink = LocalMetricsSink()
    executor = RolloutExecutor(store, sink=sink)
    result, _ = await asyncio.gather(executor.run(request()), fake_runner(store, policy_version=policy_version))
    assert result.outcome == "trained" and len(result.outputs) == 2
    for output in result.outputs:
        extra = output["extra_fields"]
        assert (extra["min_global_steps"], extra["max_global_steps"]) == (4, 4)  # verl's step - 1
        assert extra["agentbolt"]["policy_version"] is None
        assert extra["agentbolt"]["resources_version"] == policy_version
    assert sink.drain()["agentbolt/rollouts/weights_version_unknown_calls"] == 2
