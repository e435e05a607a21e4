"""Every published record agrees with its own ``metrics.jsonl``: nothing in ``result.json`` can be
edited by hand without a test failing.

For each ``docs/runs/<example>/result.json`` (and its variants), :func:`disagreements` recomputes
from the run's ``metrics.jsonl`` and the held-out sets' ``n``:

- the held-out scores before and after (and at each ``step K`` stage): the ``val/accuracy`` the run
  logged at step 0, at each stage's step and at its last step is the n-weighted mean of the sets'
  scores (a run logs one held-out figure over all its sets);
- per-set stages a run logged set by set (``kind: heldout`` rows with a ``tier``): each stage's
  score, standard error, tool-call rate and ``n``, the first stage being ``before`` and the last
  ``after``;
- the counts behind a 0/1 metric: ``score * n`` is a whole number of questions and the standard
  error is ``sqrt(p (1 - p) / n)``;
- ``s_per_step`` and the ``time/*`` / ``engine/*`` / ``update/*`` figures of ``extra``: the mean over the trained
  steps, at the record's rounding; ``extra.train_reward``: each step's ``train/reward`` to 3 places;
- ``steps``: the last trained step;
- a ``step K`` stage's ``training_s`` (the steps' ``time/step_s`` summed up to step K) and
  ``gain_z`` (its gain over the first stage in standard errors).

Where the run published its per-question outcomes (``heldout_items.json``, the quickstart does),
:func:`item_disagreements` recomputes from them each stage's score and standard error, ``before``,
``after`` and ``n``, and the paired gains (``paired_gain_z``, ``gain_se_paired``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from agentbolt.runs.evaluation import RunRecord, mean_and_se, paired_gain

REPO = Path(__file__).resolve().parents[2]
RUNS = REPO / "docs" / "runs"
RECORDS = sorted(str(p.parent.relative_to(RUNS)) for p in RUNS.glob("**/result.json"))
BINARY = {"accuracy", "execution_accuracy", "exact_match"}
"""Metrics that score each question 0 or 1: their counts and standard errors follow from ``n``."""
ROUNDING = 0.051
"""How far a figure the record rounds (to 1 decimal or finer) may sit from the value it rounds."""


def _close(a: float, b: float, tol: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=tol, abs_tol=tol)


def _rows(metrics: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip()]


def _binary(where: str, score: float, se: float | None, n: int) -> list[str]:
    problems = []
    if not _close(score * n, round(score * n), 1e-6):
        problems.append(f"{where}: {score} * n = {score * n:.4f} questions, not a whole number (n = {n})")
    if se is not None and not _close(se, math.sqrt(score * (1 - score) / n), 1e-6):
        problems.append(f"{where}: se {se} != sqrt(p (1 - p) / n) = {math.sqrt(score * (1 - score) / n)}")
    return problems


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def disagreements(record: RunRecord, rows: list[dict[str, Any]]) -> list[str]:
    """What in ``record`` its metrics rows (``metrics.jsonl``) do not say; ``[]`` when all agree.

    Raises ``LookupError`` when the metrics hold no held-out figure to check before/after against.
    """
    problems: list[str] = []
    sets = record.heldout
    total_n = sum(s.n for s in sets.values())

    def weighted(scores: dict[str, float]) -> float:
        return sum(scores[name] * s.n for name, s in sets.items()) / total_n

    for name, s in sets.items():
        if s.metric in BINARY:
            problems += _binary(f"{name}.before", s.before, s.before_se, s.n)
            problems += _binary(f"{name}.after", s.after, s.after_se, s.n)
            for stage, values in s.stages.items():
                if "score" in values:
                    problems += _binary(f"{name}.stages[{stage}]", values["score"], values.get("se"), s.n)

    checked = set()
    # 1. one held-out figure over all sets, logged at steps (val/accuracy without a tier)
    overall = {r["step"]: r["val/accuracy"] for r in rows if "val/accuracy" in r and "tier" not in r}
    targets = {0: ("before", weighted({n: s.before for n, s in sets.items()}))}
    targets[record.steps] = ("after", weighted({n: s.after for n, s in sets.items()}))
    stage_names = {stage for s in sets.values() for stage in s.stages}
    for stage in stage_names:
        if stage.startswith("step ") and all(stage in s.stages for s in sets.values()):
            step = int(stage.removeprefix("step "))
            targets.setdefault(
                step, (f"stages[{stage}]", weighted({n: s.stages[stage]["score"] for n, s in sets.items()}))
            )
    for step, (what, value) in targets.items():
        if step in overall:
            checked.add(what)
            if not _close(overall[step], value):
                problems.append(
                    f"{what}: the n-weighted mean over the held-out sets is {value}, but metrics.jsonl "
                    f"logged val/accuracy {overall[step]} at step {step}"
                )

    # 2. per-set stages logged set by set
    for name, s in sets.items():
        logged = [r for r in rows if r.get("kind") == "heldout" and r.get("tier") == name]
        if not logged:
            continue
        for r in logged:
            stage = s.stages.get(r["stage"])
            if stage is None:
                problems.append(f"{name}: metrics.jsonl logged stage {r['stage']!r}, the record has none")
                continue
            for key, logged_key in (
                ("score", "val/accuracy"),
                ("se", "val/se"),
                ("tool_call_rate", "val/tool_call_rate"),
            ):
                if logged_key in r and not (key in stage and _close(stage[key], r[logged_key])):
                    problems.append(
                        f"{name}.stages[{r['stage']}].{key} = {stage.get(key)}, metrics.jsonl: {r[logged_key]}"
                    )
            if r.get("val/n") not in (None, s.n):
                problems.append(f"{name}.n = {s.n}, metrics.jsonl: {r['val/n']} at stage {r['stage']}")
        first, last = logged[0], logged[-1]
        for what, value, row in (("before", s.before, first), ("after", s.after, last)):
            checked.add(what)
            if not _close(value, row["val/accuracy"]):
                problems.append(f"{name}.{what} = {value}, metrics.jsonl: {row['val/accuracy']} (stage {row['stage']})")
    missing = {"before", "after"} - checked
    if missing:
        raise LookupError(
            f"metrics.jsonl holds no held-out figure for {sorted(missing)}: nothing to recompute them from"
        )

    # 3. per-step figures
    trained = sorted((r for r in rows if "time/step_s" in r), key=lambda r: r["step"])
    if trained and trained[-1]["step"] != record.steps:
        problems.append(f"steps = {record.steps}, but the last trained step in metrics.jsonl is {trained[-1]['step']}")
    if trained and abs(record.s_per_step - _mean([r["time/step_s"] for r in trained])) > ROUNDING:
        problems.append(
            f"s_per_step = {record.s_per_step}, metrics.jsonl: {_mean([r['time/step_s'] for r in trained])}"
        )
    for key, value in record.extra.items():
        if key.startswith(("time/", "engine/", "update/")) and isinstance(value, int | float):
            logged_values = [r[key] for r in trained if key in r]
            if logged_values and abs(value - _mean(logged_values)) > ROUNDING:
                problems.append(
                    f"extra[{key!r}] = {value}, the mean over metrics.jsonl's steps is {_mean(logged_values)}"
                )
    # a stage's training seconds: the logged steps' time/step_s up to its step; its gain over the first stage
    spent = 0.0
    by_step = {0: 0.0}
    for r in trained:
        spent += r["time/step_s"]
        by_step[r["step"]] = spent
    for name, s in sets.items():
        stages = [(k, v) for k, v in s.stages.items() if k.startswith("step ")]
        for stage, values in stages:
            step = int(stage.removeprefix("step "))
            if "training_s" in values and abs(values["training_s"] - by_step.get(step, math.nan)) > ROUNDING:
                problems.append(
                    f"{name}.stages[{stage}].training_s = {values['training_s']}, metrics.jsonl's time/step_s "
                    f"up to step {step} sum to {by_step.get(step)}"
                )
            if "gain_z" in values:
                first = stages[0][1]
                gain = (values["score"] - first["score"]) / math.hypot(first["se"], values["se"])
                if abs(values["gain_z"] - gain) > 0.0051:
                    problems.append(f"{name}.stages[{stage}].gain_z = {values['gain_z']}, recomputed {gain}")
    rewards = record.extra.get("train_reward")
    if isinstance(rewards, list):
        logged_rewards = [
            round(r["train/reward"], 3) for r in sorted(rows, key=lambda r: r["step"]) if "train/reward" in r
        ]
        if rewards != logged_rewards:
            problems.append(f"extra['train_reward'] = {rewards}, metrics.jsonl's train/reward: {logged_rewards}")
    return problems


def item_disagreements(record: RunRecord, items: dict[str, Any]) -> list[str]:
    """What in the record's held-out set disagrees with the run's per-question outcomes
    (``heldout_items.json``: ``{"set", "task_ids", "stages": {"step K": [0/1, ...]}}``)."""
    name = items["set"]
    if name not in record.heldout:
        return [f"heldout_items.json is about {name!r}, the record has no such set"]
    s = record.heldout[name]
    problems = []
    ids = items["task_ids"]
    if len(ids) != s.n or len(set(ids)) != len(ids):
        problems.append(f"{name}.n = {s.n}, heldout_items.json has {len(ids)} questions ({len(set(ids))} distinct)")
    outcomes = {stage: [float(x) for x in values] for stage, values in items["stages"].items()}
    if any(len(v) != len(ids) for v in outcomes.values()) or any(
        x not in (0.0, 1.0) for v in outcomes.values() for x in v
    ):
        return [*problems, "heldout_items.json: every stage must score each question 0 or 1"]
    if set(outcomes) != {k for k in s.stages if k.startswith("step ")}:
        problems.append(f"{name}: heldout_items.json has stages {sorted(outcomes)}, the record {sorted(s.stages)}")
    names = list(outcomes)
    first = outcomes[names[0]]
    for stage, values in outcomes.items():
        recorded = s.stages.get(stage, {})
        mean, se = mean_and_se(values)
        for key, value in (("score", mean), ("se", se)):
            if not _close(recorded.get(key, math.nan), value):
                problems.append(f"{name}.stages[{stage}].{key} = {recorded.get(key)}, the questions give {value}")
        if "paired_gain_z" in recorded:
            diff, paired_se = paired_gain(first, values)
            z = diff / paired_se if paired_se else math.nan
            if not abs(recorded["paired_gain_z"] - z) <= 0.0051:
                problems.append(f"{name}.stages[{stage}].paired_gain_z = {recorded['paired_gain_z']}, recomputed {z}")
    for what, value, stage in (("before", s.before, names[0]), ("after", s.after, names[-1])):
        if not _close(value, mean_and_se(outcomes[stage])[0]):
            problems.append(f"{name}.{what} = {value}, the questions give {mean_and_se(outcomes[stage])[0]} ({stage})")
    paired_se = paired_gain(first, outcomes[names[-1]])[1]
    if s.gain_se_paired is None or paired_se is None or not _close(s.gain_se_paired, paired_se):
        problems.append(f"{name}.gain_se_paired = {s.gain_se_paired}, recomputed {paired_se}")
    return problems


@pytest.mark.parametrize("where", RECORDS)
def test_a_record_agrees_with_its_metrics(where: str) -> None:
    record = RunRecord.load(RUNS / where / "result.json")
    rows = _rows(RUNS / where / "metrics.jsonl")
    # the per-step checks (steps, s_per_step, time/*, engine/*) only run over trained steps
    assert any("time/step_s" in r for r in rows), f"docs/runs/{where}/metrics.jsonl logs no trained step"
    problems = disagreements(record, rows)
    items = RUNS / where / "heldout_items.json"
    if items.is_file():
        problems += item_disagreements(record, json.loads(items.read_text(encoding="utf-8")))
    assert not problems, f"docs/runs/{where}/result.json disagrees with its metrics.jsonl:\n" + "\n".join(problems)


def test_every_published_example_is_checked() -> None:
    assert {"sql_agent", "rag_agent", "calc_agent", "quickstart"} <= set(RECORDS)


def test_the_issue_edit_fails(tmp_path: Path) -> None:
    """Setting the unseen-database ``after`` to 0.9 (its metrics say the run ended at 0.625 over both
    sets) is caught, and so is a se or an n edited alone."""
    source = RUNS / "sql_agent"
    data = json.loads((source / "result.json").read_text(encoding="utf-8"))
    data["heldout"]["unseen_dbs"]["after"] = 0.9
    (tmp_path / "result.json").write_text(json.dumps(data), encoding="utf-8")
    record = RunRecord.load(tmp_path / "result.json")
    problems = disagreements(record, _rows(source / "metrics.jsonl"))
    assert any(p.startswith("after: the n-weighted mean") for p in problems), problems
    assert any(p.startswith("unseen_dbs.after: se") for p in problems), problems

    original = RunRecord.load(source / "result.json")
    assert disagreements(original, _rows(source / "metrics.jsonl")) == []
    unseen = original.heldout["unseen_dbs"]
    for edit in ({"after_se": 0.05}, {"n": 61}):
        changed = original.model_copy(
            update={"heldout": {**original.heldout, "unseen_dbs": unseen.model_copy(update=edit)}}
        )
        assert disagreements(changed, _rows(source / "metrics.jsonl")), edit
    slower = original.model_copy(update={"s_per_step": original.s_per_step + 1})
    assert disagreements(slower, _rows(source / "metrics.jsonl")) == [
        f"s_per_step = {original.s_per_step + 1}, metrics.jsonl: {_mean([r['time/step_s'] for r in _rows(source / 'metrics.jsonl') if 'time/step_s' in r])}"
    ]


def test_a_staged_record_is_checked_tier_by_tier() -> None:
    """calc_agent logs each tier's stages: an sft score edited in the record is caught."""
    source = RUNS / "calc_agent"
    record = RunRecord.load(source / "result.json")
    large = record.heldout["large"]
    stages = {**large.stages, "sft": {**large.stages["sft"], "score": 0.725}}
    changed = record.model_copy(
        update={"heldout": {**record.heldout, "large": large.model_copy(update={"stages": stages})}}
    )
    problems = disagreements(changed, _rows(source / "metrics.jsonl"))
    assert any(p.startswith("large.stages[sft].score = 0.725") for p in problems), problems


def test_a_record_without_heldout_metrics_is_refused() -> None:
    record = RunRecord.load(RUNS / "sql_agent" / "result.json")
    with pytest.raises(LookupError, match="no held-out figure"):
        disagreements(record, [{"step": 1, "time/step_s": 1.0}])


def test_stage_training_seconds_and_gains_are_recomputed() -> None:
    """A quickstart record's ``step K`` stages with their training seconds and gains: right ones
    pass, an edited one is caught."""
    source = RUNS / "quickstart" / "variants" / "own-6e3d9b0"  # a record written before stages had them
    rows = _rows(source / "metrics.jsonl")
    record = RunRecord.load(source / "result.json")
    arithmetic = record.heldout["arithmetic"]
    first = arithmetic.stages["step 0"]
    spent = {k: sum(r["time/step_s"] for r in rows if "time/step_s" in r and r["step"] <= k) for k in (0, 10, 20)}
    stages = {
        name: values
        | {"training_s": round(spent[int(name.removeprefix("step "))], 1)}
        | (
            {"gain_z": round((values["score"] - first["score"]) / math.hypot(first["se"], values["se"]), 2)}
            if name != "step 0"
            else {}
        )
        for name, values in arithmetic.stages.items()
    }

    def with_stages(stages: dict[str, dict[str, float]]) -> RunRecord:
        return record.model_copy(update={"heldout": {"arithmetic": arithmetic.model_copy(update={"stages": stages})}})

    assert disagreements(with_stages(stages), rows) == []
    slower = {**stages, "step 10": {**stages["step 10"], "training_s": stages["step 10"]["training_s"] + 30}}
    assert any(p.startswith("arithmetic.stages[step 10].training_s") for p in disagreements(with_stages(slower), rows))
    bigger = {**stages, "step 20": {**stages["step 20"], "gain_z": 3.9}}
    assert any(p.startswith("arithmetic.stages[step 20].gain_z") for p in disagreements(with_stages(bigger), rows))


def test_the_quickstart_publishes_its_questions_and_an_edit_is_caught() -> None:
    """The published quickstart's per-question outcomes agree with its record; a paired gain, a
    stage score or one question's outcome edited alone is caught."""
    source = RUNS / "quickstart"
    record = RunRecord.load(source / "result.json")
    items = json.loads((source / "heldout_items.json").read_text(encoding="utf-8"))
    assert item_disagreements(record, items) == []
    arithmetic = record.heldout["arithmetic"]

    def with_stage(stage: str, **edit: float) -> RunRecord:
        stages = {**arithmetic.stages, stage: {**arithmetic.stages[stage], **edit}}
        return record.model_copy(update={"heldout": {"arithmetic": arithmetic.model_copy(update={"stages": stages})}})

    paired = arithmetic.stages["step 10"]["paired_gain_z"]
    assert any(
        ".paired_gain_z" in p for p in item_disagreements(with_stage("step 10", paired_gain_z=paired + 1), items)
    )
    score = arithmetic.stages["step 15"]["score"]
    assert any("step 15].score" in p for p in item_disagreements(with_stage("step 15", score=score + 0.05), items))
    flipped = json.loads(json.dumps(items))
    last = list(flipped["stages"])[-1]
    flipped["stages"][last][0] = 1 - flipped["stages"][last][0]
    problems = item_disagreements(record, flipped)
    assert any(p.startswith("arithmetic.after") for p in problems) and any("gain_se_paired" in p for p in problems)
    looser = record.model_copy(
        update={
            "heldout": {"arithmetic": arithmetic.model_copy(update={"gain_se_paired": arithmetic.gain_se_paired * 0.8})}
        }
    )
    assert any("gain_se_paired" in p for p in item_disagreements(looser, items))
