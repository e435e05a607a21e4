"""An agentbolt agent (a plain OpenAI client) and its tasks, exported as a verifiers environment."""

from openai import OpenAI

from agentbolt_verifiers import export_environment

TASKS = [{"task_id": f"sum-{a}-{b}", "a": a, "b": b} for a, b in [(2, 3), (5, 8), (13, 21)]]


def calc_agent(task, resources):
    client = OpenAI(base_url=resources.llm.base_url, api_key=resources.llm.api_key or "x", max_retries=0)
    reply = client.chat.completions.create(
        model=resources.llm.model, messages=[{"role": "user", "content": f"What is {task['a']} + {task['b']}?"}]
    )
    return float((reply.choices[0].message.content or "").strip() == str(task["a"] + task["b"]))


CalcTaskset, CalcHarness, CalcEnv = export_environment(calc_agent, TASKS, name="Calc")

__all__ = ["CalcEnv", "CalcHarness", "CalcTaskset"]
