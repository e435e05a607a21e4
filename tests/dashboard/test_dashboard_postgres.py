"""The dashboard's pages on a PostgreSQL store (rendered server-side; the browser tests use SQLite)."""

from __future__ import annotations

import secrets

import httpx
import pytest

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.store import RunSpec, open_store
from agentbolt.testing.store_conformance import llm_span
from agentbolt_dashboard import create_app


@pytest.mark.postgres
async def test_pages_on_postgresql(postgres_url: str) -> None:
    store = open_store(f"{postgres_url}?schema=dash_{secrets.token_hex(4)}", sweep_interval_s=0)
    try:
        run = await store.start_run(RunSpec(name="pg-run", algorithm="torch-grpo", config={"steps": 1}))
        await store.add_run_metrics(run.run_id, 1, {"train/reward": 0.5, "update/loss": 0.25})
        specs = [
            t.RolloutSpec(rollout_id=f"{run.run_id}:step1:q:{k}", task_id="q", input={"question": "2+2?"},
                          group_id=f"{run.run_id}:step1:q", run_id=run.run_id, step=1)
            for k in range(2)
        ]  # fmt: skip
        await store.enqueue(specs)
        for claim, reward in zip(await store.dequeue("w", limit=2), (1.0, 0.0), strict=True):
            rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
            await store.add_spans([llm_span(rid, aid, **{semconv.TOKEN_SOURCE: "exact"})])
            await store.finish_attempt(aid, t.AttemptStatus.SUCCEEDED, reward=reward)
        app = create_app(store)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://d") as client:
            assert "pg-run" in (await client.get("/runs")).text
            assert (await client.get(f"/runs/{run.run_id}")).status_code == 200
            metrics = (await client.get(f"/api/runs/{run.run_id}/metrics")).json()
            assert metrics[0]["values"] == {"train/reward": 0.5, "update/loss": 0.25}
            page = (await client.get("/rollouts", params={"run": run.run_id, "step": 1, "reward_min": 0.5})).text
            assert specs[0].rollout_id in page and specs[1].rollout_id not in page and "1 matching" in page
            trajectory = (await client.get(f"/rollouts/{specs[0].rollout_id}")).text
            assert '<span class="ok">trained</span>' in trajectory and 'data-id="5"' in trajectory  # token id 5
            assert (await client.get(f"/runs/{run.run_id}/rewards")).status_code == 200
            health = (await client.get("/health")).text
            assert 'id="queue-length">0<' in health
            assert (await client.get("/rollouts/nope")).status_code == 404
    finally:
        await store.close()
