"""A smolagents team, instrumented the way smolagents' users already do it: OpenInference.

``manager`` (a ``ToolCallingAgent``) hands each arithmetic question to its managed agent
``solver``, which calls the ``calculator`` tool and returns the result; the manager answers with
``final_answer``. Nothing here refers to agentbolt: the agent gets its model's base URL from
``resources`` and ``SmolagentsInstrumentor().instrument()`` is the line a smolagents user adds
for Phoenix. Installed next to ``agentbolt-openinference``, those spans tell LightningRL which
agent made each call and which tools ran.

The prompts are short versions of smolagents' own with one worked example each (the default
system prompt alone is about 1,000 tokens, too much for a 135M model on CPU); passing
``prompt_templates`` is smolagents' way.
"""

from __future__ import annotations

import importlib.resources
import random
import re
from typing import Any

import yaml
from openinference.instrumentation.smolagents import SmolagentsInstrumentor
from smolagents import OpenAIServerModel, ToolCallingAgent, tool

SmolagentsInstrumentor().instrument()  # the user's own instrumentation (as for Phoenix)

SOLVER_PROMPT = """You solve arithmetic: call the calculator with the expression, then final_answer with its result.
Example:
What is 3 + 4?
<tool_call>
{"name": "calculator", "arguments": {"expression": "3 + 4"}}
</tool_call>
Observation: 7
<tool_call>
{"name": "final_answer", "arguments": {"answer": "7"}}
</tool_call>
Tools:
{%- for tool in tools.values() %}
- {{ tool.name }}: {{ tool.description }}
{%- endfor %}"""
MANAGER_PROMPT = """You answer arithmetic questions: give the question to your team member solver, then call final_answer with its result.
Example:
What is 3 + 4?
<tool_call>
{"name": "solver", "arguments": {"task": "What is 3 + 4?"}}
</tool_call>
Observation: 7
<tool_call>
{"name": "final_answer", "arguments": {"answer": "7"}}
</tool_call>
Team members:
{%- for agent in managed_agents.values() %}
- {{ agent.name }}: {{ agent.description }}
{%- endfor %}"""
TASK_PROMPT = "{{task}}"


def _templates(system_prompt: str) -> Any:
    """smolagents' tool-calling templates with a short system prompt and a plain managed-agent task."""
    text = importlib.resources.files("smolagents.prompts").joinpath("toolcalling_agent.yaml").read_text()
    templates = yaml.safe_load(text)
    templates["system_prompt"] = system_prompt
    templates["managed_agent"]["task"] = TASK_PROMPT
    return templates


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 12 + 7.

    Args:
        expression: numbers joined by +, -, * or /.
    """
    if not re.fullmatch(r"[0-9+\-*/(). ]+", expression):
        raise ValueError(f"not an arithmetic expression: {expression!r}")
    value = eval(expression, {"__builtins__": {}})  # digits and operators only
    return str(int(value) if float(value).is_integer() else value)


def make_team(base_url: str, model: str, api_key: str = "x") -> ToolCallingAgent:
    """The manager with its managed ``solver``, on the model served at ``base_url``."""
    llm = OpenAIServerModel(model_id=model, api_base=base_url, api_key=api_key)
    solver = ToolCallingAgent(
        tools=[calculator],
        model=llm,
        name="solver",
        description="Solves an arithmetic question with the calculator.",
        prompt_templates=_templates(SOLVER_PROMPT),
        max_steps=2,
        verbosity_level=-1,  # LogLevel.OFF: no console output per step
    )
    return ToolCallingAgent(
        tools=[],
        model=llm,
        managed_agents=[solver],
        name="manager",
        prompt_templates=_templates(MANAGER_PROMPT),
        max_steps=2,
        verbosity_level=-1,  # LogLevel.OFF: no console output per step
    )


def agent(task: dict[str, Any], resources: Any) -> float:
    """One rollout: the team answers the question; reward 1.0 when the final answer is right."""
    llm = resources.llm
    try:
        answer = make_team(llm.base_url, llm.model, llm.api_key or "x").run(task["question"])
    except Exception:  # the team gave up (a reply it could not parse, no steps left): no reward
        return 0.0
    return reward(answer, task["answer"])


def reward(answer: Any, expected: int) -> float:
    numbers = re.findall(r"-?\d+", str(answer))
    return float(bool(numbers) and int(numbers[-1]) == expected)


def tasks(n: int, *, held_out: bool, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` additions. Training questions have an odd first operand, held-out ones an even one,
    so the two sets share no question by construction."""
    rng = random.Random(seed + (1 if held_out else 0))
    out = []
    for i in range(n):
        a = 2 * rng.randint(1, 24) + (0 if held_out else 1)
        b = rng.randint(1, 20)
        split = "val" if held_out else "train"
        out.append({"task_id": f"{split}-{i}", "question": f"What is {a} + {b}?", "answer": a + b, "operands": [a, b]})
    return out
