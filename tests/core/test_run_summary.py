"""The run summary card (agentbolt.runs.summary): its figures are the run record's, for any mix
of finished, failed and unfinished held-out rollouts, and it names the metric as the run does."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentbolt import types as t
from agentbolt.runs.answer import rollout_answer
from agentbolt.runs.evaluation import set_score
from agentbolt.runs.summary import HeldoutMetric, heldout_metric, summarize
from agentbolt.store.run_records import Run, RunMetrics

RUN = "run-x"


def rollout(i: int, step: int, reward: float | None, status: t.RolloutStatus) -> t.Rollout:
    return t.Rollout(
        rollout_id=f"{RUN}:val{step}:{i}",
        task_id=f"q{i}",
        mode=t.RolloutMode.VAL,
        status=status,
        final_reward=reward,
        run_id=RUN,
        step=step,
    )


outcome = st.tuples(
    st.sampled_from([0.0, 0.1, 1.0, None]),
    st.sampled_from([t.RolloutStatus.SUCCEEDED, t.RolloutStatus.FAILED]),
)


@settings(max_examples=60, deadline=None)
@given(before=st.lists(outcome, min_size=1, max_size=30), after_seed=st.integers(0, 1000))
def test_the_card_equals_the_record(before: list[tuple[float | None, t.RolloutStatus]], after_seed: int) -> None:
    """Before/after means, standard errors and n equal set_score of the per-item outcomes (a failed
    rollout or one without a reward scores 0, as read_heldout counts it); an unfinished rollout
    (still running) counts in neither."""
    rng = random.Random(after_seed)
    after = [(rng.choice([0.0, 0.1, 1.0]), t.RolloutStatus.SUCCEEDED) for _ in before]
    rollouts = [rollout(i, 0, r, s) for i, (r, s) in enumerate(before)]
    rollouts += [rollout(i, 20, r, s) for i, (r, s) in enumerate(after)]
    rollouts.append(rollout(99, 20, None, t.RolloutStatus.RUNNING))
    run = Run(run_id=RUN, algorithm="torch-grpo", started_at=0.0, config={"success_threshold": 1.0})
    card = summarize(run, rollouts, [])

    def score(r: float | None, s: t.RolloutStatus) -> float:
        return r if s is t.RolloutStatus.SUCCEEDED and r is not None else 0.0

    accuracy = set_score(
        "accuracy", [float(score(*x) >= 1.0) for x in before], [float(score(*x) >= 1.0) for x in after]
    )
    reward = set_score("reward", [score(*x) for x in before], [score(*x) for x in after])
    assert [h.metric for h in card.heldout] == ["accuracy", "reward"]
    for figure, record in zip(card.heldout, (accuracy, reward), strict=True):
        assert (figure.first.step, figure.last.step) == (0, 20)
        assert (figure.first.mean, figure.first.se, figure.last.mean, figure.last.se) == pytest.approx(
            (record.before, record.before_se, record.after, record.after_se)
        )
        assert figure.first.n == figure.last.n == record.n


@settings(max_examples=60, deadline=None)
@given(outcomes=st.lists(outcome, min_size=1, max_size=30))
def test_the_trajectory_verdict_counts_as_the_card_does(outcomes: list[tuple[float | None, t.RolloutStatus]]) -> None:
    """The trajectory page's verdict of every held-out rollout sums to the card's held-out accuracy
    (a failed rollout is wrong whatever reward it reported); a running rollout has no verdict."""
    rollouts = [rollout(i, 0, r, s) for i, (r, s) in enumerate(outcomes)]
    running = rollout(99, 0, 1.0, t.RolloutStatus.RUNNING)
    run = Run(run_id=RUN, algorithm="torch-grpo", started_at=0.0, config={"success_threshold": 1.0})
    metric = heldout_metric(run.config)
    card = summarize(run, [*rollouts, running], [])
    verdicts = [rollout_answer(r, [], [], metric).correct for r in rollouts]
    assert None not in verdicts
    assert card.headline is not None and card.headline.first.n == len(verdicts)
    assert card.headline.first.mean * len(verdicts) == pytest.approx(sum(map(bool, verdicts)))
    assert rollout_answer(running, [], [], metric).correct is None
    assert rollout_answer(rollout(0, 0, 1.0, t.RolloutStatus.FAILED), [], [], metric).verdict == "✗ wrong (accuracy)"


def test_the_metric_is_named_as_the_run_names_it() -> None:
    assert heldout_metric({"heldout_metric": {"name": "exact_match", "threshold": 0.5}}) == HeldoutMetric(
        "exact_match", 0.5
    )
    assert heldout_metric({"success_threshold": 1.0}) == HeldoutMetric("accuracy", 1.0)
    assert heldout_metric({}) is None and heldout_metric({"success_threshold": True}) is None
    run = Run(
        run_id=RUN,
        algorithm="x",
        started_at=0.0,
        config={"heldout_metric": {"name": "exact_match", "threshold": 1.0}, "trivial": {"constant": 0.25}},
    )
    card = summarize(run, [rollout(0, 0, 1.0, t.RolloutStatus.SUCCEEDED)], [])
    assert card.headline is not None and card.headline.label == "held-out exact_match"
    lines = card.lines()
    assert lines[0].startswith("held-out exact_match 1.000 ± 0.000 (n=1, step 0; one evaluation)")
    assert "trivial policies (exact_match): best constant 0.250" in lines
    no_metric = summarize(
        Run(run_id=RUN, algorithm="x", started_at=0.0), [rollout(0, 0, 0.4, t.RolloutStatus.SUCCEEDED)], []
    )
    assert [h.label for h in no_metric.heldout] == ["held-out reward"]


def test_training_reward_is_the_mean_of_the_last_steps_and_s_per_step_the_mean() -> None:
    run = Run(run_id=RUN, algorithm="x", started_at=0.0)
    rewards = [0.1, 0.9, 0.2, 0.3, 0.4, 0.5, 0.6]
    metrics = [
        RunMetrics(run_id=RUN, seq=i, step=i + 1, time=0.0, values={"train/reward": r, "time/step_s": 10.0 + i})
        for i, r in enumerate(rewards)
    ]
    card = summarize(run, [], metrics, last_k=5)
    assert card.train_reward == pytest.approx(sum(rewards[-5:]) / 5) and card.train_reward_steps == 5
    assert card.s_per_step == pytest.approx(13.0) and card.timed_steps == 7
    assert "training reward 0.400 (mean of the last 5 steps)" in card.lines()
    assert card.lines()[0] == "held-out: no evaluation recorded"
