"""The RAG agent on the Agents SDK's default model — the Responses API, no
``OpenAIChatCompletionsModel`` — through the gateway's ``/v1/responses``, streaming and not: every
call has exact token ids and the agent that made it."""

from __future__ import annotations

from typing import Any

import pytest
from agents import Runner
from agents.models.openai_provider import OpenAIProvider
from agents.run import RunConfig
from openai import AsyncOpenAI
from openai_agents_rag import RETRIEVER, TASKS, build_agents, make_backend

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.testing.adapter_conformance import AdapterConformance, AdapterRun
from agentbolt.testing.fake_llm import FakeTokenizer
from agentbolt_openai_agents import OpenAIAgentsAdapter


async def _run(task: dict[str, str], resources: Any, *, stream: bool) -> float:
    # The SDK's defaults: a model *name* and the OpenAI provider, which speaks the Responses API.
    # The client is this run's own: the provider's default one is shared by the whole process, and
    # its pooled connections belong to the event loop of the first dev() that used them.
    async with AsyncOpenAI(base_url=resources.llm.base_url, api_key="x", max_retries=0) as client:
        config = RunConfig(model=resources.llm.model, model_provider=OpenAIProvider(openai_client=client))
        retriever = build_agents(None)  # type: ignore[arg-type]  # model from the RunConfig
        if stream:
            result = Runner.run_streamed(retriever, task["question"], run_config=config)
            async for _ in result.stream_events():
                pass
        else:
            result = await Runner.run(retriever, task["question"], run_config=config)
    return 1.0 if task["answer"] in str(result.final_output) else 0.0


async def responses_agent(task: dict[str, str], resources: Any) -> float:
    return await _run(task, resources, stream=False)


async def streamed_responses_agent(task: dict[str, str], resources: Any) -> float:
    return await _run(task, resources, stream=True)


class _Responses(AdapterConformance):
    def __init__(self, agent: Any) -> None:
        self.agent = agent

    def make_agent(self) -> Any:
        return self.agent

    def make_backend(self) -> Any:
        return make_backend()


@pytest.mark.parametrize("agent", [responses_agent, streamed_responses_agent], ids=["create", "stream"])
def test_default_responses_model_calls_have_exact_ids_and_agent_names(agent: Any) -> None:
    adapter = OpenAIAgentsAdapter()
    adapter.instrument()
    try:
        run: AdapterRun = _Responses(agent).run_dev(tasks=TASKS[:2])
    finally:
        adapter.uninstrument()
    tok = FakeTokenizer()
    assert len(run.rollouts) == 2
    for rollout in run.rollouts:
        assert rollout.status is t.RolloutStatus.SUCCEEDED and rollout.final_reward == 1.0
        gateway = run.gateway_spans(rollout.rollout_id)
        assert [s.attributes[semconv.LLM_API] for s in gateway] == ["responses"] * 3
        assert all(s.attributes[semconv.GEN_AI_RESPONSE_ID].startswith("resp_") for s in gateway)
        transitions = sorted(
            (tr for tr in run.transitions if tr.rollout_id == rollout.rollout_id), key=lambda x: x.index
        )
        assert [tr.agent_name for tr in transitions] == ["retriever", "retriever", "answerer"]
        by_span = {s.span_id: s for s in gateway}
        for tr in transitions:
            assert tr.token_source is t.TokenSource.EXACT
            assert tr.prompt_ids == by_span[tr.span_id].attributes[semconv.PROMPT_TOKEN_IDS]
            assert tr.response_ids == by_span[tr.span_id].attributes[semconv.RESPONSE_TOKEN_IDS]
        first_prompt = transitions[0].prompt_ids
        assert tok.decode(first_prompt).count(RETRIEVER) == 1  # instructions became the system message
        answer = f"The answer is {rollout.input['answer']}."
        assert transitions[-1].response_ids == tok.encode(answer)
