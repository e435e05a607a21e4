"""The capture report when the Agents SDK adapter cannot instrument (tracing disabled): dev used to
say "capture ok" while every call lost its agent name; now the runner records the failure on each
attempt and the report is not ok, naming the adapter and what to do."""

from __future__ import annotations

import pytest
from agents import set_tracing_disabled
from openai_agents_rag import TASKS, make_backend, rag_agent

from agentbolt.options import CaptureOptions, RunnerOptions
from agentbolt.store.memory import MemoryStore
from agentbolt.testing.fake_llm import FakeLLMServer
from agentbolt.trainer import Trainer


@pytest.mark.parametrize("disabled", [False, True], ids=["tracing-on", "tracing-off"])
def test_a_failed_adapter_is_reported(disabled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if disabled:
        monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "true")
    try:
        with FakeLLMServer(make_backend()) as server:
            trainer = Trainer(
                rag_agent,
                store=MemoryStore(),
                runners=RunnerOptions(n=0),
                capture=CaptureOptions(adapters=None),
                progress=False,
            )
            result = trainer.dev(TASKS[:2], llm=server.base_url, model="fake-model", n_samples=2)
    finally:
        monkeypatch.delenv("OPENAI_AGENTS_DISABLE_TRACING", raising=False)
        set_tracing_disabled(False)  # the SDK's provider keeps the env's setting
    assert result.succeeded == 4 and result.calls_with_exact_ids == result.llm_calls == 12
    report = result.report
    failed = report.finding("adapter_failed")
    if disabled:
        assert failed is not None and failed.count == 4 and "OPENAI_AGENTS_DISABLE_TRACING" in failed.message
        assert report.finding("unnamed_calls").count == 12  # type: ignore[union-attr]
        assert not result.capture_ok()
    else:
        assert failed is None and report.finding("unnamed_calls") is None
        assert "openai-agents" in report.counts.adapters and report.counts.named_calls == 12
        assert result.capture_ok(), report.render()
