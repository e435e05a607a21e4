"""Entropy collapse, caught on a real run: the tiny random model, sampling near-greedily and
fine-tuned on its own samples with a large learning rate, ends up almost certain of every token it
samples (as the quickstart's SmolLM2 run did at T = 1.0, p = 1.00 everywhere). ``agentbolt doctor``
and the recorded ``health/*`` metrics must say so; the run's first steps, still uncertain, must not."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "dashboard"))

from dashboard_helpers import TASKS, arithmetic_agent

from agentbolt.options import RunnerOptions
from agentbolt.runs.doctor import doctor
from agentbolt.runs.health import COLLAPSE_SURPRISAL
from agentbolt.store import open_store
from agentbolt.trainer import Trainer
from agentbolt_torch.training.sft import TorchSFT


def test_entropy_collapse_of_a_real_run_is_flagged(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    algorithm = TorchSFT(
        "tiny",
        threshold=0.0,  # imitate every sample: the policy sharpens onto its own near-greedy outputs
        sampling={"temperature": 0.05, "max_tokens": 12},
        evaluation={"every": None},
        generation={"engine": {"batch_window_s": 0.01}},
        output={"out_dir": tmp_path / "out", "plot": False},
        steps=8,
        # 32 samples a step: the doctor's last window (the last 2 of 8 steps) then holds at least
        # 64 sampled tokens, over its 50-token floor whatever replies the policy collapses onto
        # (with 8 a step, a collapse onto 3-token replies left 48 tokens and no finding: which
        # replies win depends on how requests happened to share batches, i.e. on timing)
        batch_size=4,
        group_size=8,
        update={"lr": 0.05, "epochs": 2, "mini_batches": 2},
        seed=0,
    )
    Trainer(arithmetic_agent, algorithm, store=url, runners=RunnerOptions(n=0), progress=False).fit(
        TASKS[:4], TASKS[4:]
    )

    async def read() -> tuple[object, list[object]]:
        store = open_store(url)
        try:
            (run,) = await store.list_runs()
            return await doctor(store), await store.get_run_metrics(run.run_id)
        finally:
            await store.close()

    report, metrics = asyncio.run(read())
    (run,) = report.runs  # type: ignore[attr-defined]
    codes = {f.code for f in run.findings}
    assert {"entropy_collapse", "identical_samples"} <= codes
    assert run.last.surprisal <= COLLAPSE_SURPRISAL < 0.5 < run.first.surprisal
    recorded = {m.step: m.values["health/surprisal"] for m in metrics if "health/surprisal" in m.values}
    assert sorted(recorded) == list(range(1, 9)) and recorded[1] > 1.0 > recorded[8]
    assert report.capture_ok and not report.ok  # type: ignore[attr-defined]
