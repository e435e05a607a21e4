"""DSPy: a ``dspy.ReAct`` program with a calculator tool on ``dspy.LM`` (LiteLLM underneath; its
cache off), traced for Phoenix with OpenInference's ``DSPyInstrumentor``. A ReAct run makes three
calls: the calculator step, the ``finish`` step and the answer's extraction. Streaming, the program
is wrapped in ``dspy.streamify`` with ``StreamListener``s on ReAct's ``next_thought`` (reused at
every step) and the extraction's ``answer``, as DSPy's streaming tutorial does for ReAct: the
predictors a listener hears stream their LM calls (all three here), and the reward is scored on the
streamed answer chunks. DSPy names no agent: ``agent_names`` names the calls ``solver`` from DSPy's
system prompt. LiteLLM's offline switch
(``LITELLM_LOCAL_MODEL_COST_MAP=True``) is set, as for any LiteLLM user without network."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import calc

from agentbolt import types as t
from agentbolt.testing.fake_llm import FakeLLM, FakeRequest, Rule

STREAMING = False
CAPTURE = {"agent_names": {"solver": re.compile(r"`question`")}}


def setup() -> None:
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    from openinference.instrumentation.dspy import DSPyInstrumentor

    DSPyInstrumentor().instrument()


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 12 * 7."""
    return calc.calculator(expression)


def agent(task: dict[str, Any], resources: t.Resources) -> float:
    import dspy

    assert resources.llm is not None
    lm = dspy.LM(f"openai/{resources.llm.model}", api_base=resources.llm.base_url, api_key="x", cache=False)
    react = dspy.ReAct("question -> answer", tools=[calculator], max_iters=3)
    with dspy.context(lm=lm):
        if not STREAMING:
            prediction = react(question=task["question"])
            return calc.score(str(prediction.answer), task["answer"])
        listeners = [  # a predictor streams when a listener hears one of its fields
            dspy.streaming.StreamListener(signature_field_name="next_thought", allow_reuse=True),  # each ReAct step
            dspy.streaming.StreamListener(signature_field_name="answer"),  # the extraction
        ]
        program = dspy.streamify(react, stream_listeners=listeners, async_streaming=False)
        chunks: dict[str, list[str]] = {"next_thought": [], "answer": []}
        for value in program(question=task["question"]):
            if isinstance(value, dspy.streaming.StreamResponse):
                chunks[value.signature_field_name].append(value.chunk)
    if not all(chunks.values()):
        raise RuntimeError(f"dspy.streamify streamed no chunk of a listened field: {chunks}")
    return calc.score("".join(chunks["answer"]), task["answer"])


def backend() -> FakeLLM:
    """DSPy's ChatAdapter fields: a calculator step, a ``finish`` step, then the extracted answer."""

    def prompt(request: FakeRequest) -> str:
        return " ".join(calc.text(m.get("content")) for m in request.messages or [])

    def observation(request: FakeRequest) -> str | None:
        match = re.search(r"\[\[ ## observation_0 ## \]\]\s*(\S+)", prompt(request))
        return match.group(1) if match else None

    def step(request: FakeRequest) -> str:
        if observation(request) is None:
            name, args = "calculator", json.dumps({"expression": calc.expression(request)})
        else:
            name, args = "finish", "{}"
        return (
            "[[ ## next_thought ## ]]\nI use the calculator.\n\n[[ ## next_tool_name ## ]]\n"
            f"{name}\n\n[[ ## next_tool_args ## ]]\n{args}\n\n[[ ## completed ## ]]"
        )

    def extract(request: FakeRequest) -> str:
        return (
            "[[ ## reasoning ## ]]\nThe calculator said so.\n\n[[ ## answer ## ]]\n"
            f"The answer is {observation(request)}.\n\n[[ ## completed ## ]]"
        )

    return FakeLLM(
        rules=[
            Rule(match=lambda r: "next_tool_name" in prompt(r), reply=step),
            Rule(reply=extract),
        ]
    )
