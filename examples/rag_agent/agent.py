"""The RAG agent: an OpenAI Agents SDK ``Agent`` with a ``search`` tool over a local BM25 index.

Nothing in it knows about training: it reads the model's base URL and name from
``resources``, answers ``task["question"]`` with the SDK's ``Runner`` and reports how the
``<answer>`` scores against ``task["answers"]`` (``reward.py``) with agentbolt's
``emit_reward``: the reward that trains (token F1 plus a format term) and, as further
dimensions of the same reward, the held-out metrics exact match and F1.
``task["index"]`` is the SQLite FTS5 file built by ``train.py`` (``retrieval.py``).

The few-shot turns (passed as the run's input items, as any SDK user would) show two questions
solved through ``search``, and ``ModelSettings(tool_choice="search")`` makes the first reply a
``search`` call (the SDK resets it to ``auto`` once the tool ran): left to itself,
SmolLM2-135M-Instruct answered at once, from nothing, and never searched (README, "Design").
"""

from __future__ import annotations

import json
from typing import Any

from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelBehaviorError,
    ModelSettings,
    OpenAIProvider,
    RunConfig,
    Runner,
    function_tool,
)
from openai import AsyncOpenAI
from retrieval import SearchIndex
from reward import scores

from agentbolt.capture.emit import emit_reward

INSTRUCTIONS = "Answer the question. Search for facts you do not know. Give the answer inside <answer>...</answer>."
MAX_TURNS = 3
TOOL_CHOICE: str | None = "search"
"""``"search"``: the first reply must call ``search`` (the SDK resets it to ``auto`` after the call)."""
TOP_K = 2


def format_hits(index: SearchIndex, query: str) -> str:
    """What ``search`` returns: the best paragraphs, one per line."""
    hits = index.search(query, k=TOP_K)
    return "\n".join(hit.text for hit in hits) if hits else "No results."


def make_search_tool(index_path: str) -> Any:
    """The ``search`` function tool over the index at ``index_path``."""
    index = SearchIndex(index_path)

    @function_tool
    def search(query: str) -> str:
        """Search the encyclopedia."""
        return format_hits(index, query)

    return search


def _search_example(call_id: str, question: str, query: str, result: str, answer: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": question},
        {"type": "function_call", "call_id": call_id, "name": "search", "arguments": json.dumps({"query": query})},
        {"type": "function_call_output", "call_id": call_id, "output": result},
        {"role": "assistant", "content": f"<answer>{answer}</answer>"},
    ]


FEW_SHOT: list[dict[str, Any]] = [
    *_search_example(
        "call_0",
        "In which city was the author of The Copper Kettle born?",
        "author of The Copper Kettle",
        "The Copper Kettle is a novel from 1954. Lina Dorwick wrote it.\n"
        "Lina Dorwick is the author of The Copper Kettle. Lina Dorwick was born in Harrowgate and studied at "
        "Belmonton.",
        "Harrowgate",
    ),
    *_search_example(
        "call_1",
        "Which university did the founder of Dalton Foods attend?",
        "founder of Dalton Foods",
        "Dalton Foods is a company from 1931. Ada Merrow founded it.\n"
        "Ada Merrow is the founder of Dalton Foods. Ada Merrow was born in Kestrelby and studied at "
        "Orlandford.",
        "Orlandford",
    ),
]


def report(text: str | None, answers: list[str]) -> float:
    """Emit the reply's ``reward`` (what trains), ``exact_match`` and ``f1`` as reward dimensions; return the reward."""
    values = scores(text, answers)
    emit_reward(values, primary="reward", final=True)
    return values["reward"]


async def rag_agent(task: dict[str, Any], resources: Any) -> None:
    """Answer ``task["question"]`` with search; the reward scores the ``<answer>`` against ``task["answers"]``.

    The reward and the held-out metrics (exact match, F1) are emitted as one final reward with
    three dimensions; training uses ``reward``.
    """
    assert resources.llm is not None, "publish an llm endpoint in the resources"
    async with AsyncOpenAI(
        base_url=resources.llm.base_url, api_key=resources.llm.api_key or "none", max_retries=0
    ) as client:
        agent = Agent(
            name="researcher",
            instructions=INSTRUCTIONS,
            model=resources.llm.model,
            tools=[make_search_tool(task["index"])],
            model_settings=ModelSettings(tool_choice=TOOL_CHOICE),
        )
        question = [*FEW_SHOT, {"role": "user", "content": task["question"]}]
        try:
            # The SDK's default model (the Responses API) on this run's client.
            run_config = RunConfig(model_provider=OpenAIProvider(openai_client=client))
            result = await Runner.run(agent, question, max_turns=MAX_TURNS, run_config=run_config)  # type: ignore[arg-type]
        except MaxTurnsExceeded:
            report(None, task["answers"])  # still searching after MAX_TURNS calls: no answer
            return
        except ModelBehaviorError:
            report(None, task["answers"])  # a reply cut at max_tokens: the Responses API calls it incomplete
            return
    report(str(result.final_output), task["answers"])
