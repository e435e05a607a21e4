"""Toy agents and a toy policy for APO tests (a module, so runner processes can import them).

The task: say the given word back. Letter words are expected in upper case, digit words as they
are. The fake policy answers in upper case only when its system prompt asks for it, so the
prompt decides the reward: a prompt without the instruction scores the share of digit words.
"""

from __future__ import annotations

from typing import Any

import openai

from agentbolt import types as t
from agentbolt.testing.fake_llm import FakeLLM, FakeRequest

WORDS = ["apple", "river", "stone", "cloud", "12", "tiger", "maple", "7", "ocean", "piano", "candle", "33"]


def tasks(words: list[str]) -> list[dict[str, str]]:
    """One task per word: ``{"task_id", "word", "expected"}``."""
    return [{"task_id": w, "word": w, "expected": w.upper()} for w in words]


def policy_reply(request: FakeRequest) -> str:
    """The toy policy: the user's word, in upper case when the system prompt says ``uppercase``."""
    messages = request.messages or []
    system = " ".join(str(m.get("content", "")) for m in messages if m.get("role") == "system")
    word = str(messages[-1].get("content", "")) if messages else ""
    return word.upper() if "uppercase" in system.lower() else word


def policy() -> FakeLLM:
    """The fake policy server's backend."""
    return FakeLLM(default_reply=policy_reply)


async def _ask(resources: t.Resources, system: str, word: str) -> str:
    assert resources.llm is not None
    client = openai.AsyncOpenAI(base_url=resources.llm.base_url, api_key="k", max_retries=0)
    reply = await client.chat.completions.create(
        model=resources.llm.model,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": word}],
    )
    return (reply.choices[0].message.content or "").strip()


async def prompt_agent(task: dict[str, Any], resources: t.Resources) -> float:
    """Reads its system prompt from the resources: the one change APO needs."""
    answer = await _ask(resources, resources.prompts["system"], task["word"])
    return float(answer == task["expected"])


async def deaf_agent(task: dict[str, Any], resources: t.Resources) -> float:
    """Ignores the prompt resource (its own fixed system prompt): APO must say so."""
    answer = await _ask(resources, "Repeat the word.", task["word"])
    return float(answer == task["expected"])


async def conformance_agent(task: dict[str, Any], resources: t.Resources) -> float:
    """The conformance suite's parity agent, reading its system prompt from the resources."""
    if task.get("fail"):
        raise RuntimeError(f"task {task['task_id']} fails on purpose (conformance: failed rollouts)")
    answer = await _ask(resources, resources.prompts["system"], task["question"])
    return float(len(answer) % 2)


def no_llm_agent(task: dict[str, Any], resources: t.Resources) -> float:
    """Calls no LLM through the gateway (as an agent calling a hosted model directly): the reward
    still depends on the prompt."""
    answer = task["word"].upper() if "uppercase" in resources.prompts["system"].lower() else task["word"]
    return float(answer == task["expected"])
