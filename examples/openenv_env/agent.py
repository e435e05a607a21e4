"""The example's agent: agentbolt-openenv's default ReAct loop, set up for a 135M model.

SmolLM2-135M-Instruct reads two worked questions, then each question of the episode as a user
message, and answers as ``<action>N</action>``; the loop turns that into ``{"answer": N}`` (the
action schema has one field) and steps the server. Of each observation the model reads only the
question ("What is 22 - 7?"): not the feedback on its last answer, which tells the right one, nor
the observation's ``metadata`` (the right answer, for the logs). The conversation keeps the
episode's earlier questions and answers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from agentbolt_openenv import OpenEnvAgent, ReActLoop

SYSTEM = "You are a helpful assistant. Always give the final answer as a number inside <action>...</action>."

EXAMPLES = [
    {"role": "user", "content": "What is 3 + 5?"},
    {"role": "assistant", "content": "3 + 5 = 8. <action>8</action>"},
    {"role": "user", "content": "What is 20 - 4?"},
    {"role": "assistant", "content": "20 - 4 = 16. <action>16</action>"},
]
"""Two worked questions before the episode's own."""

MAX_TURNS = 3
"""Model calls per episode: one per question, and one more for a reply without an action."""

_QUESTION = re.compile(r"What is -?\d+ [+-] -?\d+\?")


def show_question(observation: Mapping[str, Any]) -> str:
    """What the model reads of an observation: the question it asks (the whole text when it asks none)."""
    text = str(observation.get("text", ""))
    found = _QUESTION.search(text)
    return found.group() if found else text


def arith_agent(base_url: str, max_turns: int = MAX_TURNS) -> OpenEnvAgent:
    """The agent of the arithmetic server at ``base_url``: the episode's return (the fraction of
    its questions answered right) is the reward (``reward_rule="sum"``)."""
    loop = ReActLoop(system_prompt=SYSTEM, examples=EXAMPLES, render=show_question)
    return OpenEnvAgent(base_url, loop=loop, max_turns=max_turns, reward_rule="sum")
