"""``torch-traced-rl``: RL updates over a stored run of traced rollouts, nothing sampled.

The store is filled by the real path: the tiny model served by the policy server (a plain
OpenAI-compatible server, not the gateway), the deployed agent of ``examples/traces_agent`` in
its own process (a plain ``openai`` client, OpenInference's instrumentation, the real OTLP/HTTP
exporter), ``agentbolt.traces`` receiving, retokenizing with the drift check and scoring each
trace with a scoring function. Then ``Trainer(agent, TorchTracedRL(...)).fit([], val)``.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agentbolt import types as t
from agentbolt.errors import UserError
from agentbolt.lightningrl import LightningRL, LightningRLConfig
from agentbolt.options import RunnerOptions
from agentbolt.store import RolloutSearch, open_store
from agentbolt.store.run_records import RunSpec
from agentbolt.trainer import Trainer
from agentbolt_torch.policy import Policy
from agentbolt_torch.training.traced_rl import TorchTracedRL, read_traced_run

pytest.importorskip("openinference.instrumentation.openai")
openai = pytest.importorskip("openai")
torch = pytest.importorskip("torch")

DEPLOYED_AGENT = Path(__file__).resolve().parents[2] / "examples" / "traces_agent" / "deployed_agent.py"
RUN = "prod-traces"
# the scoring function's verdict per production question, whatever the random model replied:
# deterministic positives and negatives, and one trace nobody scored
REWARDS: dict[str, float | None] = {
    "What is 2 + 3?": 1.0,
    "What is 4 + 4?": 0.0,
    "What is 6 + 1?": 1.0,
    "What is 5 + 2?": 0.0,
    "What is 9 + 0?": 1.0,
    "What is 3 + 3?": None,
}
# what the deployed model answered (the rewarded replies are the right ones)
REPLIES = {
    "What is 2 + 3?": "The answer is 5.",
    "What is 4 + 4?": "I cannot say.",
    "What is 6 + 1?": "The answer is 7.",
    "What is 5 + 2?": "Maybe 9.",
    "What is 9 + 0?": "The answer is 9.",
    "What is 3 + 3?": "The answer is 6.",
}
QUESTIONS = [*REWARDS, "What is 4 + 4?"]  # production asked one question twice: two traces, one input


def score(traced: Any) -> float | None:
    question = [m["content"] for m in traced.trajectory.messages if m.get("role") == "user"][-1]
    return REWARDS[question]


class HostedModel(ThreadingHTTPServer):
    """The deployment's model server (outside agentbolt, like a hosted API or the team's vLLM):
    an OpenAI-compatible chat endpoint whose replies are fixed per question, its token usage
    counted with the served model's tokenizer and chat template (+ EOS), as vLLM reports it."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        super().__init__(("127.0.0.1", 0), _HostedHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _HostedHandler(BaseHTTPRequestHandler):
    server: HostedModel

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        messages, tok = request["messages"], self.server.tokenizer
        text = REPLIES[messages[-1]["content"]]
        prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        usage = {
            "prompt_tokens": len(tok.encode(prompt, add_special_tokens=False)),
            "completion_tokens": len(tok.encode(text, add_special_tokens=False)) + 1,
        }
        body = json.dumps(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": request["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {**usage, "total_tokens": sum(usage.values())},
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def traced_store(tmp_path_factory: pytest.TempPathFactory, tiny: tuple[Any, Any]) -> str:
    """A sqlite store holding the run ``prod-traces``: one traced rollout per question."""
    from agentbolt.traces import IngestOptions, IngestThread, SpanTranslation, TraceIngestor

    out = tmp_path_factory.mktemp("traced-rl")
    url = f"sqlite:///{out / 'traces.db'}"
    questions = out / "questions.jsonl"
    questions.write_text("".join(json.dumps({"question": q}) + "\n" for q in QUESTIONS))
    translation = SpanTranslation(tiny[1])  # retokenized with the policy's tokenizer, drift-checked
    model = HostedModel(tiny[1])
    try:
        with IngestThread(
            url,
            lambda store: TraceIngestor(
                store, RUN, translation=translation, options=IngestOptions(quiet_s=0.5), scorer=score
            ),
            grpc_port=None,
        ) as ingest:
            done = subprocess.run(
                [
                    sys.executable,
                    str(DEPLOYED_AGENT),
                    *("--base-url", model.base_url, "--model", "tiny"),
                    *("--otlp", f"{ingest.http_url}/v1/traces", "--questions", str(questions), "--concurrency", "3"),
                ],
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, done.stderr[-4000:]
            ingest.call(lambda ingestor: ingestor.complete_all(), timeout=120)
    finally:
        model.shutdown()
        model.server_close()
    return url


async def _read(url: str) -> tuple[list[t.Rollout], dict[str, list[t.Span]]]:
    store = open_store(url)
    try:
        rollouts = (await store.search_rollouts(RolloutSearch(run_id=RUN, limit=100))).items
        return rollouts, await store.query_spans([r.rollout_id for r in rollouts], latest_attempt_only=True)
    finally:
        await store.close()


async def _count(url: str, run: str = RUN, group_by: Any = "batch", **config: Any) -> Any:
    store = open_store(url)
    try:
        lrl = LightningRL(LightningRLConfig(**config))
        return await read_traced_run(store, run, lrl, group_by=group_by, page_size=2)
    finally:
        await store.close()


def test_every_call_is_trained_or_excluded_with_its_reason(traced_store: str) -> None:
    rollouts, spans = asyncio.run(_read(traced_store))
    assert len(rollouts) == len(QUESTIONS) and all(r.metadata.get("agentbolt.source") == "trace" for r in rollouts)
    # read in pages of 2: the same counts as LightningRL over the whole run at once
    report, items = asyncio.run(_count(traced_store, allow_retokenized=True))
    whole = LightningRL(LightningRLConfig(allow_retokenized=True)).collect(rollouts, spans).report
    assert (report.calls, report.trained_calls, report.excluded) == (whole.calls, whole.trained_calls, whole.excluded)
    assert report.calls == report.trained_calls + sum(report.excluded.values())
    assert report.rollouts == report.rewarded + report.skipped_no_reward == len(QUESTIONS)
    # the trace nobody scored is skipped and counted, its call excluded as missing_reward, never a 0
    assert report.skipped_no_reward == 1 and report.excluded.get("missing_reward") == 1
    unscored = next(r for r in rollouts if r.final_reward is None)
    assert all(unscored.rollout_id not in item for item in items)
    kept = {rid for item in items for rid in item}
    assert len(kept) == report.trainable and all(r.final_reward is not None for r in rollouts if r.rollout_id in kept)
    # rows trained = calls of rewarded rollouts that LightningRL kept (one epoch)
    rewarded = [r for r in rollouts if r.rollout_id in kept]
    batch = LightningRL(LightningRLConfig(allow_retokenized=True)).process(rewarded, spans)
    assert len(batch.rows) == report.trained_calls > 0 and all(r.behaviour_logprobs is None for r in batch.rows)
    # grouped by input: the two traces of one question share a group, the others are groups of one
    by_input, groups = asyncio.run(_count(traced_store, group_by="input", allow_retokenized=True))
    assert sorted(len(g) for g in groups) == [1, 1, 1, 1, 2] and by_input.singleton_groups == 4
    (pair,) = (g for g in groups if len(g) == 2)
    assert {r.final_reward for r in rollouts if r.rollout_id in pair} == {0.0}
    # without the allowance every traced call is excluded by name: nothing to train on
    with pytest.raises(
        UserError,
        match=r"(?s)nothing to train on: LightningRL keeps no call.*7 retokenized.*pass allow_retokenized=True",
    ):
        asyncio.run(_count(traced_store))


def test_bad_input_gets_a_clear_error(traced_store: str, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="allow_retokenized"):
        TorchTracedRL("tiny", traces=RUN)
    with pytest.raises(UserError, match=r"no behaviour \(sampling\) logprobs.*Leave rollout_is and rollout_rs unset"):
        TorchTracedRL("tiny", traces=RUN, lightningrl={"allow_retokenized": True, "rollout_is": "token"})
    with pytest.raises(UserError, match="missing_reward='fill'"):
        TorchTracedRL(
            "tiny", traces=RUN, lightningrl={"allow_retokenized": True, "missing_reward": "fill", "fill_value": 0.0}
        )
    with pytest.raises(UserError, match="no run 'nope' in the store"):
        asyncio.run(_count(traced_store, "nope", allow_retokenized=True))
    # through the Trainer: refused before any model loads
    for traces, train, message in [("nope", [], "no run 'nope'"), (RUN, [{"question": "?"}], r"call fit\(\[\], val\)")]:
        rl = TorchTracedRL("tiny", traces=traces, traces_store=traced_store, lightningrl={"allow_retokenized": True})
        trainer = Trainer(held_out_agent, rl, store="memory://", runners=RunnerOptions(n=0), progress=False)
        with pytest.raises(UserError, match=message):
            trainer.fit(train, [])

    async def unrewarded_run() -> str:
        # the same traces without their rewards: a run of traced rollouts nobody scored
        rollouts, _ = await _read(traced_store)
        url = f"sqlite:///{tmp_path / 'unscored.db'}"
        store = open_store(url)
        try:
            await store.start_run(RunSpec(run_id="unscored", name="unscored", algorithm="ingest"))
            await store.enqueue(
                [
                    t.RolloutSpec(rollout_id=f"u{i}", run_id="unscored", input=r.input, metadata=r.metadata)
                    for i, r in enumerate(rollouts)
                ]
            )
        finally:
            await store.close()
        return url

    url = asyncio.run(unrewarded_run())
    with pytest.raises(UserError, match="nothing to train on: none of its 7 rollouts has a final reward"):
        asyncio.run(_count(url, "unscored", allow_retokenized=True))


def _reply_logprobs(model: Any, rows: list[Any]) -> dict[str, float]:
    """Mean logprob of each traced reply (its response tokens) under ``model``, by rollout."""
    out = {}
    with torch.no_grad():
        for row in rows:
            ids = torch.tensor([list(row.prompt_ids) + list(row.response_ids)])
            logits = model(input_ids=ids).logits[0].float()
            logprobs = torch.log_softmax(logits[len(row.prompt_ids) - 1 : -1], dim=-1)
            token = logprobs.gather(1, torch.tensor(row.response_ids)[:, None]).squeeze(1)
            out[row.rollout_id] = float(token.mean())
    return out


async def held_out_agent(task: dict[str, Any], resources: t.Resources) -> float:
    """The deployed agent's call, as a training agent: one question, one reply, scored."""
    assert resources.llm is not None
    client = openai.AsyncOpenAI(base_url=resources.llm.base_url, api_key="none")
    reply = await client.chat.completions.create(
        model=resources.llm.model,
        messages=[{"role": "user", "content": task["question"]}],
        max_tokens=4,
        temperature=0.0,
    )
    return 1.0 if task["answer"] in (reply.choices[0].message.content or "") else 0.0


def test_offline_rl_raises_the_rewarded_replies_over_the_others(traced_store: str, tmp_path: Path) -> None:
    rollouts, spans = asyncio.run(_read(traced_store))
    rewarded = [r for r in rollouts if r.final_reward is not None]
    rows = LightningRL(LightningRLConfig(allow_retokenized=True)).collect(rewarded, spans).transitions
    base = Policy.load("tiny", seed=0)  # the weights the run starts from (same model, same seed)
    before = _reply_logprobs(base.model, rows)

    rl = TorchTracedRL(
        "tiny",
        traces=RUN,
        traces_store=traced_store,
        steps=4,
        batch_size=6,  # every rewarded trace in each step: one batch baseline
        lightningrl={"allow_retokenized": True},
        update={"lr": 2e-3},
        sampling={"max_tokens": 4},
        evaluation={"temperature": 0.0, "every": None},
        generation={"engine": {"batch_window_s": 0.01}},
        output={"out_dir": tmp_path / "out", "checkpoint_every": 4},
        policy={"autocast": None},
    )
    val = [{"task_id": "v1", "question": "What is 1 + 1?", "answer": "2"}]
    result = Trainer(held_out_agent, rl, store="memory://", runners=RunnerOptions(n=0), progress=False).fit([], val)

    report = result.traces
    assert report is not None and report.trainable == 6 and report.skipped_no_reward == 1
    assert result.steps == 4 and result.trained_rows == 4 * report.trained_calls  # each step: the whole run
    assert result.accuracy_before is not None and result.accuracy_after is not None  # val measured around it
    history = [h for h in result.history if "update/ratio_mean" in h]
    assert len(history) == 4 and history[0]["update/ratio_mean"] == pytest.approx(1.0, abs=1e-5)

    assert result.checkpoint is not None
    trained = Policy.load(str(Path(result.checkpoint) / "model"), autocast_dtype=None)
    changed = [
        not torch.equal(a, b)
        for a, b in zip(base.model.state_dict().values(), trained.model.state_dict().values(), strict=True)
    ]
    assert any(changed)
    after = _reply_logprobs(trained.model, rows)
    reward = {r.rollout_id: r.final_reward for r in rewarded}
    rise = {rid: after[rid] - before[rid] for rid in before}
    up = [rise[rid] for rid in rise if reward[rid] == 1.0]
    down = [rise[rid] for rid in rise if reward[rid] == 0.0]
    assert up and down and all(math.isfinite(x) for x in rise.values())
    # each rewarded reply gained on every unrewarded one
    assert min(up) > max(down), (up, down)
