"""agentbolt.runs.evaluation: held-out outcomes read back from a real store, standard errors, run records."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.runs.evaluation import RunRecord, mean_and_se, paired_gain, provenance, read_heldout, set_score
from agentbolt.store import open_store


def test_mean_and_standard_error() -> None:
    assert mean_and_se([1.0, 0.0, 1.0, 0.0]) == (0.5, pytest.approx(math.sqrt(0.25 / 4)))  # sqrt(p(1-p)/n)
    mean, se = mean_and_se([0.2, 0.4, 0.9])
    assert mean == pytest.approx(0.5) and se == pytest.approx(math.sqrt((0.09 + 0.01 + 0.16) / 3) / math.sqrt(3))
    assert mean_and_se([1.0]) == (1.0, 0.0)
    with pytest.raises(ValueError, match="no values"):
        mean_and_se([])


def test_set_score_and_gain() -> None:
    score = set_score("accuracy", [0.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0], base={"score": 0.25})
    assert (score.n, score.before, score.after) == (4, 0.25, 0.75)
    assert score.gain_in_se == pytest.approx(0.5 / math.hypot(score.before_se, score.after_se))
    assert score.stages == {"base": {"score": 0.25}}
    with pytest.raises(ValueError, match="same items"):
        set_score("accuracy", [1.0], [1.0, 0.0])
    assert math.isnan(set_score("accuracy", [1.0, 1.0], [1.0, 1.0]).gain_in_se)


def test_paired_gain_uses_the_per_question_differences() -> None:
    before, after = [0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]
    assert paired_gain(before, after) == (0.25, pytest.approx(0.5 / 2))  # stdev([1, 0, 0, 0]) / sqrt(4)
    score = set_score("accuracy", [0.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0])
    assert score.gain_se_paired == pytest.approx(math.sqrt(1 / 3) / 2)  # sample stdev of [1, 1, 0, 0] / sqrt(4)
    assert score.paired_gain_in_se == pytest.approx(0.5 / score.gain_se_paired)
    # questions that trade places: no gain, though some questions changed
    traded = set_score("accuracy", [1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 1.0, 0.0])
    assert traded.paired_gain_in_se == 0.0 and traded.gain_se_paired and traded.gain_se_paired > 0
    # correlated outcomes (what was right stays right): the paired error is below the independent one
    correlated = set_score("accuracy", [1.0] * 5 + [0.0] * 5, [1.0] * 7 + [0.0] * 3)
    assert correlated.gain_se_paired is not None
    assert correlated.gain_se_paired < math.hypot(correlated.before_se, correlated.after_se)
    assert paired_gain([1.0], [0.0]) == (-1.0, None)
    assert math.isnan(set_score("accuracy", [1.0, 0.0], [1.0, 0.0]).paired_gain_in_se or 0.0)
    with pytest.raises(ValueError, match="same items"):
        paired_gain([1.0], [1.0, 0.0])
    with pytest.raises(ValueError, match="no values"):
        paired_gain([], [])


def test_a_record_written_before_paired_errors_has_none() -> None:
    record = RunRecord.model_validate(_record())
    assert record.heldout["dev"].gain_se_paired is None and record.heldout["dev"].paired_gain_in_se is None


def _record(**changes: object) -> dict:
    base = {
        "example": "x",
        "command": "python examples/x/train.py",
        "commit": "0" * 40,
        "date": "2026-11-26",
        "machine": "2 vCPU, AVX-512, no GPU",
        "model": "m",
        "steps": 2,
        "wall_s": 10.0,
        "s_per_step": 5.0,
        "heldout": {
            "dev": {"metric": "exact_match", "n": 4, "before": 0.0, "before_se": 0.0, "after": 0.5, "after_se": 0.25}
        },
        "headline": "dev/exact_match",
    }
    return {**base, **changes}


def test_run_record_round_trip_and_checks(tmp_path: Path) -> None:
    record = RunRecord.model_validate(_record())
    path = record.write(tmp_path / "runs" / "x" / "result.json")
    assert RunRecord.load(path) == record
    assert json.loads(path.read_text())["heldout"]["dev"]["stages"] == {}
    with pytest.raises(ValidationError, match="headline 'dev/f1' is not one of"):
        RunRecord.model_validate(_record(headline="dev/f1"))
    with pytest.raises(ValidationError, match="extra"):
        RunRecord.model_validate(_record(surprise=1))


def test_provenance_names_the_commit_and_a_dirty_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    repo = tmp_path / "repo"
    (repo / "examples").mkdir(parents=True)
    script = repo / "examples" / "train.py"
    script.write_text("print(1)\n")

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("-c", "user.email=a@b", "-c", "user.name=a", "add", ".")
    git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "x")
    sha = git("rev-parse", "HEAD")
    found = provenance([str(script), "--steps", "3", "--out", "a b"])
    assert found["command"] == "python examples/train.py --steps 3 --out 'a b'"
    assert found["commit"] == sha and len(found["date"]) == 10 and found["machine"].endswith("no GPU")
    script.write_text("print(2)\n")
    assert provenance([str(script)])["commit"] == f"{sha}+dirty"
    assert provenance([str(script)], device="cuda")["machine"].endswith("cuda")
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # thread settings lead the command
    assert provenance([str(script), "-x"])["command"] == "OMP_WAIT_POLICY=PASSIVE python examples/train.py -x"
    outside = tmp_path / "elsewhere.py"
    outside.write_text("")
    assert provenance([str(outside)])["commit"] == "unknown"


async def _fill(url: str) -> None:
    """Two runs' held-out rollouts as the runners leave them: rewards, reward spans, recorded replies."""
    store = open_store(url)
    try:
        for run, rewards in (("run-old", [0.0, 0.0]), ("run-new", [1.0, 0.25])):
            for tag in ("val0", "val2"):
                specs = [
                    t.RolloutSpec(
                        rollout_id=f"{run}:{tag}:task-{i}:0",
                        task_id=f"task-{i}",
                        input={},
                        mode=t.RolloutMode.VAL,
                        group_id=f"{run}:{tag}:task-{i}",
                        run_id=run,
                    )
                    for i in range(3)
                ]
                await store.enqueue(specs)
                claims = await store.dequeue("w", limit=3)
                for claim in claims:
                    i = int(claim.rollout.task_id.split("-")[1])
                    if i == 2:  # the third one fails
                        await store.finish_attempt(claim.attempt.attempt_id, t.AttemptStatus.FAILED)
                        continue
                    value = rewards[i]
                    reply = {"choices": [{"message": {"tool_calls": [{"function": {"name": "search"}}]}}]}
                    spans = [
                        t.Span.create(
                            "llm",
                            rollout_id=claim.rollout.rollout_id,
                            attempt_id=claim.attempt.attempt_id,
                            attributes={semconv.LLM_RESPONSE: json.dumps(reply)} if i == 0 else {},
                        ),
                        t.Span.create(
                            semconv.SPAN_REWARD,
                            rollout_id=claim.rollout.rollout_id,
                            attempt_id=claim.attempt.attempt_id,
                            attributes={
                                semconv.REWARD_VALUE: value,
                                semconv.REWARD_DIMENSIONS: json.dumps(
                                    {"reward": value, "exact_match": float(value == 1)}
                                ),
                                semconv.REWARD_IS_FINAL: True,
                            },
                        ),
                    ]
                    await store.add_spans(spans)
                    await store.finish_attempt(claim.attempt.attempt_id, t.AttemptStatus.SUCCEEDED, reward=value)
    finally:
        await store.close()


def test_read_heldout_reads_the_latest_runs_outcomes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    asyncio.run(_fill(url))
    outcomes = asyncio.run(read_heldout(url, ["val0", "val2"]))
    assert set(outcomes) == {"val0", "val2"}
    found = outcomes["val2"]
    assert [o.task_id for o in found] == ["task-0", "task-1", "task-2"]  # task order, the latest run only
    assert [o.rollout_id.split(":")[0] for o in found] == ["run-new"] * 3
    assert [o.score() for o in found] == [1.0, 0.25, 0.0]  # the failed rollout scores 0
    assert [o.score("exact_match") for o in found] == [1.0, 0.0, 0.0]
    assert found[0].tool_calls == ("search",) and found[1].tool_calls == () and not found[2].succeeded
    with pytest.raises(KeyError, match="no reward dimension 'f1'"):
        found[0].score("f1")
    older = asyncio.run(read_heldout(url, ["val0"], run_id="run-old", spans=False))["val0"]
    assert [o.reward for o in older] == [0.0, 0.0, None] and older[0].dimensions == {}
