"""Google ADK: an ``LlmAgent`` named ``solver`` with a calculator function tool on ADK's
``LiteLlm`` model (an OpenAI-compatible endpoint), run by an ``InMemoryRunner`` (streaming:
``RunConfig(streaming_mode=StreamingMode.SSE)``, its partial events then the final one), traced for
Phoenix with OpenInference's ``GoogleADKInstrumentor``. LiteLLM's offline switch
(``LITELLM_LOCAL_MODEL_COST_MAP=True``) is set, as for any LiteLLM user without network."""

from __future__ import annotations

import os
from typing import Any

import calc

from agentbolt import types as t

STREAMING = False


def setup() -> None:
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    from openinference.instrumentation.google_adk import GoogleADKInstrumentor

    GoogleADKInstrumentor().instrument()


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 12 * 7."""
    return calc.calculator(expression)


async def agent(task: dict[str, Any], resources: t.Resources) -> float:
    from google.adk.agents import LlmAgent, RunConfig
    from google.adk.agents.run_config import StreamingMode
    from google.adk.models.lite_llm import LiteLlm
    from google.adk.runners import InMemoryRunner
    from google.genai import types

    assert resources.llm is not None
    model = LiteLlm(model=f"openai/{resources.llm.model}", api_base=resources.llm.base_url, api_key="x")
    solver = LlmAgent(name="solver", model=model, instruction=calc.SYSTEM_PROMPT, tools=[calculator])
    runner = InMemoryRunner(agent=solver, app_name="calc")
    session = await runner.session_service.create_session(app_name="calc", user_id="user")
    answer, partials = "", 0
    message = types.Content(role="user", parts=[types.Part(text=task["question"])])
    config = RunConfig(streaming_mode=StreamingMode.SSE if STREAMING else StreamingMode.NONE)
    async for event in runner.run_async(user_id="user", session_id=session.id, new_message=message, run_config=config):
        partials += bool(event.partial)  # SSE: the text's chunks as partial events, then the whole
        if event.is_final_response() and event.content and event.content.parts:
            answer = "".join(part.text or "" for part in event.content.parts)
    if STREAMING and not partials:
        raise RuntimeError("StreamingMode.SSE produced no partial event")
    return calc.score(answer, task["answer"])
