"""The relay in front of vLLM (:class:`~agentbolt_torch.serving.vllm_front.VLLMFront`) without vLLM:
its upstream is agentbolt's fake OpenAI backend, so these run in the default suite, while
tests/torch/test_vllm_generator.py checks the relay against a real vLLM server.

Invariants: every answer is stamped with the version the gate held at admission; a call made
while paused reaches no upstream until resume; the gate's counts agree with the calls made and
with the upstream's; nothing is left in flight."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer
from agentbolt_torch.serving.openai_routes import POLICY_NAME_HEADER, POLICY_VERSION_HEADER
from agentbolt_torch.serving.vllm_front import AdmissionGate, VLLMFront


@pytest.fixture
def upstream() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(FakeLLM()) as server:
        yield server


def _front(upstream: FakeLLMServer, gate: AdmissionGate) -> VLLMFront:
    front = VLLMFront(upstream.url, gate)
    front.start()
    return front


def _chat(url: str, model: str, *, stream: bool = False) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return httpx.post(f"{url}/chat/completions", json=body, timeout=30)


@pytest.mark.parametrize("stream", [False, True])
def test_every_call_is_stamped_and_counted(upstream: FakeLLMServer, stream: bool) -> None:
    gate = AdmissionGate()
    gate.resume({}, 3)
    front = _front(upstream, gate)
    try:
        calls = 6
        answers: list[httpx.Response] = []
        threads = [
            threading.Thread(target=lambda: answers.append(_chat(front.base_url, "policy", stream=stream)))
            for _ in range(calls)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(answers) == calls and all(a.status_code == 200 for a in answers)
        assert [a.headers[POLICY_VERSION_HEADER] for a in answers] == ["3"] * calls
        assert not any(POLICY_NAME_HEADER in a.headers for a in answers)
        assert gate.stats.requests == calls == len(upstream.backend.requests)
        assert gate.inflight == 0 and gate.waiting == 0
        if not stream:
            assert gate.stats.sequences == calls
            usage = [json.loads(a.content)["usage"] for a in answers]
            assert gate.stats.generated_tokens == sum(u["completion_tokens"] for u in usage) > 0
            assert gate.stats.prompt_tokens == sum(u["prompt_tokens"] for u in usage) > 0
    finally:
        front.stop()


def test_per_adapter_versions_and_names(upstream: FakeLLMServer) -> None:
    gate = AdmissionGate(adapters=frozenset({"solver", "critic"}))
    gate.resume({"solver": 5, "critic": 7}, 2)
    front = _front(upstream, gate)
    try:
        for model, version, name in [("solver", "5", "solver"), ("critic", "7", "critic"), ("policy", "2", None)]:
            answer = _chat(front.base_url, model)
            assert answer.status_code == 200
            assert answer.headers[POLICY_VERSION_HEADER] == version
            assert answer.headers.get(POLICY_NAME_HEADER) == name
        assert upstream.backend.requests[0].body["model"] == "solver"  # relayed unchanged
    finally:
        front.stop()


def test_a_call_made_while_paused_waits_and_gets_the_new_version(upstream: FakeLLMServer) -> None:
    gate = AdmissionGate()
    gate.resume({}, 0)
    front = _front(upstream, gate)
    try:
        gate.pause()
        answers: list[httpx.Response] = []
        thread = threading.Thread(target=lambda: answers.append(_chat(front.base_url, "policy")))
        thread.start()
        deadline = time.monotonic() + 30
        while gate.waiting == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gate.waiting == 1 and gate.inflight == 0
        assert len(upstream.backend.requests) == 0  # nothing reached the upstream while paused
        gate.resume({}, 1)
        thread.join(30)
        assert answers and answers[0].status_code == 200
        assert answers[0].headers[POLICY_VERSION_HEADER] == "1"
        assert gate.waiting == 0 and gate.inflight == 0 and len(upstream.backend.requests) == 1
    finally:
        front.stop()
