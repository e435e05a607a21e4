"""``agentbolt serve`` in front of a real model: TorchOnlinePolicy on the tiny random Llama.

The store (SQLite), gateway, sessions, LightningRL, gate, ledger, policy servers, engines and
updater are the real ones; nothing stands in for the model. Live calls are recorded with the
exact token ids the live slot sampled; an update trained from client feedback goes live by a
swap under concurrent traffic that fails no call (every answer is the old or the new version);
a rejected candidate leaves the live weights and the optimizer exactly as they were; a restart
serves the same weights and version.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import openai  # noqa: E402

from agentbolt import semconv  # noqa: E402
from agentbolt import types as t  # noqa: E402
from agentbolt.errors import UserError  # noqa: E402
from agentbolt.online import GateOptions, OnlinePolicy, OnlineServer, SessionOptions, UpdateOptions  # noqa: E402
from agentbolt_torch.chat import render_request  # noqa: E402
from agentbolt_torch.generation.engine import SamplingParams  # noqa: E402
from agentbolt_torch.policy import LoraSettings  # noqa: E402
from agentbolt_torch.training.online import TorchOnlinePolicy  # noqa: E402
from agentbolt_torch.update.updater import UpdateConfig  # noqa: E402

TOKEN = "s3cret"
VERSION_HEADER = "x-agentbolt-policy-version"
PROMPT = [{"role": "user", "content": "What is the capital of France?"}]
HELD_OUT = [{"question": f"held-out question {i}"} for i in range(3)]


def _policy(**options: Any) -> TorchOnlinePolicy:
    # fp32 (no autocast) and a large learning rate: an update visibly changes the tiny model
    engine = {"default_max_tokens": 6, "batch_window_s": 0.0}
    return TorchOnlinePolicy("tiny", autocast_dtype=None, update=UpdateConfig(lr=5e-2), engine=engine, **options)


def _server(tmp_path: Path, policy: TorchOnlinePolicy, agent: Callable[..., Any] | None = None) -> OnlineServer:
    return OnlineServer(
        f"sqlite:///{tmp_path / 'serve.db'}",
        policy,
        state_dir=tmp_path / "state",
        token=TOKEN,
        sessions=SessionOptions(idle_s=60),
        updates=UpdateOptions(min_sessions=4, grouping="batch", check_every_s=3600, drain_timeout_s=30),
        gate=GateOptions(agent=agent, tasks=HELD_OUT, samples=1) if agent is not None else None,
        metrics_every_s=3600,
    )


def _client(server: OnlineServer, **headers: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url, api_key=TOKEN, max_retries=0, default_headers=headers or None)


async def _served_version(resources: t.Resources, question: str) -> int:
    """Ask the evaluated version a held-out question; the version that answered."""
    assert resources.llm is not None
    async with openai.AsyncOpenAI(base_url=resources.llm.base_url, api_key="x", max_retries=0) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=resources.llm.model, messages=[{"role": "user", "content": question}], max_tokens=4
        )
    return int(raw.headers[VERSION_HEADER])


async def passing_agent(task: dict[str, Any], resources: t.Resources) -> float:
    """Every version scores the same: every candidate passes."""
    await _served_version(resources, task["question"])
    return 1.0


async def initial_only_agent(task: dict[str, Any], resources: t.Resources) -> float:
    """Only the initial version (1) scores: every candidate is worse and must stay out."""
    return 1.0 if await _served_version(resources, task["question"]) == 1 else 0.0


async def _rated_sessions(server: OnlineServer, n: int) -> None:
    """``n`` closed sessions of the model's own answers, rated 0 or 1 (GRPO has signal)."""
    import httpx

    for i in range(n):
        client = _client(server, **{"X-Agentbolt-Session-Id": f"user-{i}"})
        await client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": f"Question {i}?"}], temperature=1.0
        )
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            body = {"feedback_id": f"fb-{i}", "session_id": f"user-{i}", "reward": float(i % 2)}
            answer = await http.post(f"{server.gateway.url}/v1/feedback", json=body)
        assert answer.status_code == 200, answer.text
        await server.sessions.close(f"user-{i}")


def _trainable(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad or "lora" in n}


def _served_params(policy: TorchOnlinePolicy, slot: str) -> dict[str, torch.Tensor]:
    copy = getattr(policy, slot).engine.serving_copy
    assert copy is not None
    return {n: p.detach().clone() for n, p in copy.model.named_parameters()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _prompt_ids(policy: TorchOnlinePolicy) -> list[int]:
    """PROMPT as the policy server tokenizes it."""
    tokenizer = policy.policy.tokenizer
    return list(tokenizer(render_request(tokenizer, PROMPT).text, add_special_tokens=False)["input_ids"])


def _live_logits(policy: TorchOnlinePolicy) -> torch.Tensor:
    copy = policy.live.engine.serving_copy
    assert copy is not None
    with torch.no_grad():
        return copy.model(input_ids=torch.tensor([_prompt_ids(policy)])).logits


async def _until(condition: Callable[[], bool], timeout_s: float = 300.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached")


async def test_live_calls_are_recorded_with_the_token_ids_and_version_the_live_slot_sampled(tmp_path: Path) -> None:
    policy = _policy()
    assert isinstance(policy, OnlinePolicy)
    async with _server(tmp_path, policy) as server:
        client = _client(server, **{"X-Agentbolt-Session-Id": "chat-1"})
        raw = await client.chat.completions.with_raw_response.create(model="whatever", messages=PROMPT, temperature=0)
        answer = raw.parse()
        assert answer.model == "tiny" and int(raw.headers[VERSION_HEADER]) == server.live_version == 1
        await server.gateway.flush()
        (session,) = server.sessions.session_segments("chat-1")
        spans = (await server.store.query_spans([session.rollout_id]))[session.rollout_id]
        (call,) = [s for s in spans if s.attributes.get(semconv.SPAN_KIND_ATTR) == semconv.KIND_LLM]
        prompt_ids = _prompt_ids(policy)
        assert call.attributes[semconv.PROMPT_TOKEN_IDS] == prompt_ids
        assert call.attributes[semconv.POLICY_VERSION] == 1
        # the exact ids: greedy decoding straight on the live slot's engine samples the same tokens
        direct = policy.live.engine.generate(prompt_ids, SamplingParams(temperature=0.0, max_tokens=6))[0]
        assert call.attributes[semconv.RESPONSE_TOKEN_IDS] == direct.token_ids
        assert len(call.attributes[semconv.RESPONSE_LOGPROBS]) == len(direct.token_ids)
        assert answer.choices[0].message.content == direct.text


async def test_an_update_goes_live_under_concurrent_traffic_and_survives_a_restart(tmp_path: Path) -> None:
    policy = _policy()
    server = _server(tmp_path, policy, passing_agent)
    await server.start()
    try:
        await _rated_sessions(server, 4)
        initial = _served_params(policy, "live")
        versions: list[int] = []
        failures: list[BaseException] = []
        stop = asyncio.Event()

        async def user(i: int) -> None:
            client = _client(server, **{"X-Agentbolt-Session-Id": f"live-{i}"})
            while not stop.is_set():
                try:
                    raw = await client.chat.completions.with_raw_response.create(model="x", messages=PROMPT)
                    assert raw.parse().choices[0].message.content is not None
                    versions.append(int(raw.headers[VERSION_HEADER]))
                except BaseException as exc:
                    failures.append(exc)

        users = [asyncio.create_task(user(i)) for i in range(4)]
        await _until(lambda: len(versions) >= 4)
        assert server.trainer is not None
        decision = await server.trainer.step()
        assert decision is not None and decision.passed, decision
        new = decision.version
        await _until(lambda: new in versions[-4:])
        stop.set()
        await asyncio.gather(*users)

        assert failures == []
        assert set(versions) == {1, new} and versions.index(new) > 0  # old, then new, nothing else
        assert server.live_version == new == policy.live_version
        assert server.swaps[-1]["version"] == new
        trained = _served_params(policy, "live")
        assert not _same(trained, initial)  # the update changed the served weights
        assert _same(_trainable(policy.policy.model), trained)  # and the training copy is what is live
        logits = _live_logits(policy)
        steps = policy.updater.step
    finally:
        await server.stop()
    assert (tmp_path / "state" / "versions" / f"v{new}" / "model").is_dir()

    again = _policy()
    async with _server(tmp_path, again, passing_agent) as restarted:
        assert restarted.live_version == new == again.live_version
        assert _same(_served_params(again, "live"), trained)
        assert torch.equal(_live_logits(again), logits)
        assert again.updater.step == steps  # the optimizer's state came back with the weights
        raw = await _client(restarted).chat.completions.with_raw_response.create(model="x", messages=PROMPT)
        assert int(raw.headers[VERSION_HEADER]) == new


async def test_a_rejected_candidate_leaves_the_live_weights_and_the_optimizer_as_they_were(tmp_path: Path) -> None:
    policy = _policy()
    async with _server(tmp_path, policy, initial_only_agent) as server:
        await _rated_sessions(server, 4)
        live = _served_params(policy, "live")
        assert server.trainer is not None
        decision = await server.trainer.step()
        assert decision is not None and not decision.passed
        assert "below the noise bound" in decision.reason
        assert server.live_version == 1 == policy.live_version == policy.policy.version
        assert _same(_served_params(policy, "live"), live)  # bit for bit
        assert _same(_trainable(policy.policy.model), live)  # the training copy went back
        assert not _same(_served_params(policy, "standby"), live)  # the candidate did differ
        assert policy.updater.step == 0 and not policy.updater.optimizer.state  # as before the update
        raw = await _client(server).chat.completions.with_raw_response.create(model="x", messages=PROMPT)
        assert int(raw.headers[VERSION_HEADER]) == 1
    events = [e["event"] for e in server.ledger.replay()]
    assert events.count("gate") == 1 and events.count("live") == 1


def test_misuse_gets_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="neither"):
        TorchOnlinePolicy("no/such/model")
    policy = _policy()
    with pytest.raises(UserError, match="not started"):
        policy.train([])
    policy.start(1, None)
    try:
        with pytest.raises(UserError, match="already started"):
            policy.start(1, None)
        with pytest.raises(UserError, match="nothing is staged"):
            policy.promote()
        policy.stage(2)
        with pytest.raises(UserError, match="promote\\(\\) or revert\\(\\)"):
            policy.train([])
        policy.revert()
        assert policy.policy.version == 1 and policy.live_version == 1
    finally:
        policy.stop()
    with pytest.raises(UserError, match="not started"):
        policy.save(tmp_path / "x")


def test_a_lora_policy_saves_only_its_adapter_and_restarts_from_it(tmp_path: Path) -> None:
    pytest.importorskip("peft")
    policy = _policy(lora=LoraSettings(r=4, alpha=8))
    policy.start(1, None)
    try:
        with torch.no_grad():  # stand-in for an update: change the adapter of the training copy
            for param in policy.policy.model.parameters():
                if param.requires_grad:
                    param.add_(0.01 * (1 + torch.arange(param.numel()).reshape(param.shape) % 7))
        policy.stage(2)
        policy.save(tmp_path / "v2")
        policy.promote()
        policy.release(5.0)
        served = _served_params(policy, "live")
        logits = _live_logits(policy)
    finally:
        policy.stop()
    assert sorted(p.name for p in (tmp_path / "v2").iterdir()) == ["adapter", "optimizer.pt", "rng.pt", "state.json"]
    again = _policy(lora=LoraSettings(r=4, alpha=8))
    again.start(2, tmp_path / "v2")
    try:
        assert again.live_version == 2
        assert _same(_served_params(again, "live"), served)
        assert torch.equal(_live_logits(again), logits)
    finally:
        again.stop()


def test_agentbolt_serve_on_the_command_line_serves_a_torch_online_policy(tmp_path: Path) -> None:
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    args = [sys.executable, "-m", "agentbolt.cli", "serve", "--policy", "agentbolt_torch.training.online:tiny"]
    args += ["--port", str(port), "--store", f"sqlite:///{tmp_path / 'serve.db'}", "--state-dir", str(tmp_path / "s")]
    env = {**os.environ, "AGENTBOLT_SERVE_TOKEN": TOKEN}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    chat = {"model": "any", "messages": PROMPT, "max_tokens": 4}
    headers = {"authorization": f"Bearer {TOKEN}"}
    try:
        for _ in range(1200):  # the gateway answers 503 until the model is loaded and served
            assert proc.poll() is None, proc.communicate()[1]
            try:
                answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=chat, headers=headers)
                if answer.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        else:
            pytest.fail("agentbolt serve --policy agentbolt_torch.training.online:tiny did not answer")
        assert answer.json()["model"] == "tiny" and answer.headers[VERSION_HEADER] == "1"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "agentbolt serve on" in err
