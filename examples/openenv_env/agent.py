"""The example's agent: agentbolt-openenv's default ReAct loop, set up for a 135M model.

SmolLM2-135M-Instruct reads a few-shot episode and answers each question as
``<action>N</action>``; the loop turns that into ``{"answer": N}`` (the action schema has one
field) and steps the server. Observations are shown as their ``text`` only: the observation's
``metadata`` (the right answer, for the logs) never reaches the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentbolt_openenv import OpenEnvAgent, ReActLoop

SYSTEM = "You are a helpful assistant. Answer each question with the number inside <action>...</action>."

EXAMPLES = [
    {"role": "user", "content": "Question 1 of 2: What is 3 + 5?"},
    {"role": "assistant", "content": "3 + 5 = 8. <action>8</action>"},
    {"role": "user", "content": "Correct. Question 2 of 2: What is 20 - 4?"},
    {"role": "assistant", "content": "20 - 4 = 16. <action>16</action>"},
    {"role": "user", "content": "Correct. 2 of 2 right. A new episode starts."},
    {"role": "assistant", "content": "Ready."},
]
"""A worked episode before the real one (the environment's own wording)."""

MAX_TURNS = 3
"""Model calls per episode: one per question, and one more for a reply without an action."""


def show_text(observation: Mapping[str, Any]) -> str:
    """What the model reads of an observation: its text."""
    return str(observation.get("text", ""))


def arith_agent(base_url: str, max_turns: int = MAX_TURNS) -> OpenEnvAgent:
    """The agent of the arithmetic server at ``base_url``: the episode's return (the fraction of
    its questions answered right) is the reward (``reward_rule="sum"``)."""
    loop = ReActLoop(system_prompt=SYSTEM, examples=EXAMPLES, render=show_text)
    return OpenEnvAgent(base_url, loop=loop, max_turns=max_turns, reward_rule="sum")
