"""Helpers of the dashboard tests (imported by name, never through ``conftest``): fill a store with
real runs (``torch-grpo`` on the tiny random model through the Trainer: runner, gateway, policy
server, LightningRL, updates), serve the dashboard (``DashboardThread``), and read the store's
SQLite file in assertions (``sql``). ``scripts/dashboard_screenshots.py`` uses them too."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from agentbolt.options import RunnerOptions
from agentbolt.trainer import Trainer
from agentbolt.types import Resources


async def arithmetic_agent(task: dict[str, Any], resources: Resources) -> float:
    """Asks the policy an addition and rewards the reply: 1.0 for the right number, else the
    parity of the reply's length (a reply-dependent reward with variance inside a group)."""
    import openai

    from agentbolt import emit_reward, operation

    assert resources.llm is not None
    client = openai.AsyncOpenAI(base_url=resources.llm.base_url, api_key="none", max_retries=0)
    messages = [
        {"role": "system", "content": "You are a careful calculator. Answer with a number."},
        {"role": "user", "content": task["question"]},
    ]
    reply = await client.chat.completions.create(model=resources.llm.model, messages=messages)
    text = reply.choices[0].message.content or ""
    with operation("grade") as op:  # the reward's dimensions, nested under a grading step
        correct = str(task["answer"]) in text
        parity = float(len(text) % 2)
        reward = 1.0 if correct else parity * 0.5
        emit_reward({"reward": reward, "correct": float(correct), "parity": parity}, primary="reward")
        op.set_output(reward)
    return reward


TASKS = [{"task_id": f"add-{i}", "question": f"What is {i} + {i + 1}?", "answer": 2 * i + 1} for i in range(6)]


def train_tiny_runs(url: str, out_dir: Path, *, runs: int = 2, steps: int = 2) -> None:
    """``runs`` training runs of ``steps`` steps each into the store at ``url``."""
    from agentbolt_torch.training.algorithm import TorchGRPO

    for k in range(runs):
        algorithm = TorchGRPO(
            "tiny",
            steps=steps,
            batch_size=2,
            group_size=4,
            sampling={"max_tokens": 12},
            evaluation={"every": 1},
            generation={"engine": {"batch_window_s": 0.01}},
            output={"out_dir": out_dir / f"run{k}", "plot": False},
            update={"lr": 1e-2 * (k + 1)},
            seed=k,
        )
        trainer = Trainer(
            arithmetic_agent,
            algorithm,
            store=url,
            runners=RunnerOptions(n=0),
            progress=False,
            run={"name": f"tiny-lr{k + 1}e-2"},
        )
        trainer.fit(TASKS[:4], TASKS[4:])


class DashboardThread:
    """The dashboard of ``store_url`` served by uvicorn on a thread, on a free loopback port."""

    def __init__(self, store_url: str, *, token: str | None = None) -> None:
        self.store_url = store_url
        self.token = token
        self.url = ""
        self._thread: Any = None

    def __enter__(self) -> DashboardThread:
        import socket

        import uvicorn

        from agentbolt.cli.runs import open_existing_store
        from agentbolt.store.server.uvicorn_thread import UvicornThread
        from agentbolt_dashboard import create_app

        self._store = open_existing_store(self.store_url)
        sock = socket.create_server(("127.0.0.1", 0))
        config = uvicorn.Config(create_app(self._store, token=self.token), log_level="warning", lifespan="off")
        self._thread = UvicornThread(uvicorn.Server(config), sock, name="dashboard")
        self._thread.start()
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        return self

    def __exit__(self, *exc: Any) -> None:
        import asyncio
        import concurrent.futures

        self._thread.stop(10)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # any loop of this thread may be busy
            pool.submit(asyncio.run, self._store.close()).result()


def sql(db: Path, query: str, *args: Any) -> list[tuple[Any, ...]]:
    """Rows of a query on the store's SQLite file (read-only checks of what the pages show)."""
    with sqlite3.connect(db) as conn:
        return conn.execute(query, args).fetchall()
