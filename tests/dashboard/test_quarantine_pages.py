"""Quarantine on the dashboard and in agentbolt doctor: a run whose steps quarantined rollouts says
so on its page (training health) and in the doctor's run section; a quarantined rollout's
trajectory says why, while its group mate trains."""

from __future__ import annotations

import httpx

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.runs.doctor import doctor
from agentbolt.store import RunSpec, open_store
from agentbolt.testing.store_conformance import llm_span
from agentbolt_dashboard import create_app


async def test_run_page_trajectory_and_doctor_show_quarantine() -> None:
    store = open_store("memory://", sweep_interval_s=0)
    try:
        run = await store.start_run(RunSpec(name="q-run", algorithm="torch-grpo", config={"steps": 1}))
        await store.add_run_metrics(
            run.run_id,
            1,
            {"train/reward": 0.5, "lightningrl/quarantined": 1.0, "lightningrl/quarantined/too_large": 1.0},
        )
        specs = [
            t.RolloutSpec(rollout_id=f"{run.run_id}:step1:q:{k}", task_id="q", input={"question": "2+2?"},
                          group_id=f"{run.run_id}:step1:q", run_id=run.run_id, step=1)
            for k in range(3)
        ]  # fmt: skip
        await store.enqueue(specs)
        # an agent return stored before rewards were checked: 1e308 (the store holds any finite float)
        for claim, reward in zip(await store.dequeue("w", limit=3), (1e308, 0.0, 1.0), strict=True):
            rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
            await store.add_spans([llm_span(rid, aid, **{semconv.TOKEN_SOURCE: "exact"})])
            await store.finish_attempt(aid, t.AttemptStatus.SUCCEEDED, reward=reward)
        app = create_app(store)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://d") as client:
            page = (await client.get(f"/runs/{run.run_id}")).text
            assert 'data-code="quarantined"' in page and "too_large x1" in page
            poisoned = (await client.get(f"/rollouts/{specs[0].rollout_id}")).text
            assert 'id="quarantine"' in poisoned and "Quarantined (too_large)" in poisoned and "1e15" in poisoned
            mate = (await client.get(f"/rollouts/{specs[1].rollout_id}")).text
            assert 'id="quarantine"' not in mate and '<span class="ok">trained</span>' in mate

        report = await doctor(store)
        stored = report.finding("quarantined_values")
        assert stored is not None and stored.count == 1 and specs[0].rollout_id in stored.message
        trained = [f for f in report.findings if f.code == "quarantined"]
        assert [(f.run_id, f.count) for f in trained] == [(run.run_id, 1)]
        assert "quarantined (1)" in report.render()
    finally:
        await store.close()
