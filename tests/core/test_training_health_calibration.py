"""The sampling checks count the groups still to learn: samples of a solved group agreeing is what
learning aims at, and short replies in a fixed wording are near-certain token by token while their
samples still differ. A run that really collapsed (open groups repeating one sample) still warns,
with or without solved groups beside it, and so does a run without groups whose tokens are certain.

The runs are hand-built stores of gateway LLM-call spans (token ids and logprobs), fed to
:func:`agentbolt.runs.health.diagnose_run` as ``agentbolt doctor`` feeds it."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent / "lightningrl"))

from lrl_traces import Trace

from agentbolt import types as t
from agentbolt.runs.health import DUPLICATE_SHARE, MIN_TOKENS, RunHealth, diagnose_run

STEPS = 4
CERTAIN = -0.001
"""A logprob near 0: the policy was sure of the token (p ~ 0.999)."""
REPLY = 19
"""Tokens per reply, as the quickstart's ``12 + 5 = 17. <answer>17</answer>``."""


def run(groups: list[list[tuple[int, float]]], *, logprob: float = CERTAIN, grouped: bool = True) -> RunHealth:
    """``STEPS`` training steps, each with the same ``groups``: a group is a list of samples
    ``(reply, reward)``; samples with the same reply number repeat each other token for token."""
    rollouts: list[t.Rollout] = []
    spans: dict[str, list[t.Span]] = {}
    for step in range(1, STEPS + 1):
        for g, group in enumerate(groups):
            for k, (reply, reward) in enumerate(group):
                rid = f"s{step}-g{g}-{k}"
                trace = Trace(
                    rid,
                    group_id=f"s{step}-g{g}" if grouped else None,
                    step=step,
                    final_reward=reward,
                    mode=t.RolloutMode.TRAIN,
                )
                response = [1000 + reply] + [7] * (REPLY - 1)
                trace.llm([1, 2, 3], response, logprobs=[logprob] * REPLY)
                rollouts.append(trace.rollout)
                spans[rid] = trace.spans
    return diagnose_run("run-1", rollouts, spans)


def codes(health: RunHealth) -> dict[str, str]:
    return {f.code: f.severity for f in health.findings}


SOLVED = [(0, 1.0)] * 4
"""Four identical right answers: a solved group."""


def test_a_learned_run_with_solved_groups_and_differing_open_groups_warns_nothing() -> None:
    health = run([SOLVED, SOLVED, [(1, 1.0), (2, 0.1), (3, 0.1), (4, 1.0)], [(5, 0.1), (5, 0.1), (6, 1.0), (7, 0.1)]])
    assert health.last is not None
    assert health.last.duplicate_share == 7 / 16  # 6 in the solved groups, 1 in the open ones
    assert health.last.solved_groups == 2 and health.last.open_duplicate_share == 1 / 8
    assert health.last.near_certain_share == 1.0
    assert codes(health) == {"low_entropy": "info"}  # reported, not a warning
    (finding,) = health.findings
    assert (
        "only 12% of the samples of groups not solved" in finding.message and "2 solved groups aside" in finding.message
    )


def test_a_collapsed_run_warns_beside_solved_groups() -> None:
    stuck = [(1, 0.1)] * 4  # the same wrong answer four times
    health = run([SOLVED, SOLVED, stuck, [(2, 0.1), (2, 0.1), (2, 0.1), (3, 1.0)]])
    assert health.last is not None and health.last.open_duplicate_share == 5 / 8
    assert codes(health) == {"entropy_collapse": "warning", "identical_samples": "warning"}
    identical = next(f for f in health.findings if f.code == "identical_samples")
    assert identical.count == 1 and "(1 of 2 such groups are all alike, 2 solved groups aside)" in identical.message


def test_identical_samples_below_full_reward_are_not_solved() -> None:
    """A group is solved only at full reward: one reply repeated everywhere for a partial reward warns."""
    health = run([[(0, 0.5)] * 4] * 3 + [[(1, 0.1)] * 4])  # 0.5: the best the run earns, not a solve
    assert health.last is not None and health.last.solved_groups == 0
    assert codes(health) == {"entropy_collapse": "warning", "identical_samples": "warning"}


def test_identical_samples_on_another_reward_scale_are_not_solved() -> None:
    """On a 0-10 grade, a reward of 3 is not full reward: one reply repeated in every group warns."""
    health = run([[(0, 3.0)] * 4] * 3 + [[(1, 10.0), (2, 0.0), (3, 5.0), (4, 10.0)]])
    assert health.last is not None and health.last.solved_groups == 0
    assert codes(health) == {"entropy_collapse": "warning", "identical_samples": "warning"}


def test_without_groups_the_tokens_alone_decide() -> None:
    health = run([[(g, 0.1 if g % 2 else 1.0)] for g in range(4)], grouped=False)
    assert health.last is not None and health.last.multi_groups == 0 and health.last.open_duplicate_share is None
    assert codes(health) == {"entropy_collapse": "warning"}


def test_uncertain_tokens_raise_no_entropy_finding() -> None:
    health = run([SOLVED, [(1, 1.0), (2, 0.1), (3, 0.1), (4, 1.0)]], logprob=-0.5)
    assert codes(health) == {}


def test_every_group_solved_is_no_collapse() -> None:
    health = run([SOLVED, SOLVED, [(9, 0.1)]])  # a lone wrong sample: no group to learn from
    assert health.last is not None and health.last.solved_groups == health.last.multi_groups == 2
    assert codes(health) == {}


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 3), st.sampled_from([0.0, 0.1, 1.0, 5.0])), min_size=1, max_size=4),
        min_size=1,
        max_size=5,
    ),
    st.sampled_from([CERTAIN, -0.5]),
)
def test_findings_follow_the_open_groups(groups: list[list[tuple[int, float]]], logprob: float) -> None:
    """Whatever the groups, rewards (on a 0-1 scale or above it) and token certainty: a sampling
    warning is raised exactly when the open groups' samples repeat at least ``DUPLICATE_SHARE`` (or,
    with no group of several samples, when the certain tokens are enough to judge). The expected
    counts are worked out here from the groups, not read back from the window."""
    health = run(groups, logprob=logprob)
    last = health.last
    assert last is not None
    multi = [g for g in groups if len(g) >= 2]
    on_scale = all(reward <= 1.0 for g in groups for _, reward in g)
    open_groups = [g for g in multi if not (on_scale and all(reward >= 1.0 for _, reward in g))]
    in_open = sum(len(g) for g in open_groups)
    repeats = sum(len(g) - len({reply for reply, _ in g}) for g in open_groups)
    assert (last.multi_groups, last.solved_groups) == (len(multi), len(multi) - len(open_groups))
    assert last.open_duplicate_share == (repeats / in_open if in_open else None)
    found = codes(health)
    stuck = in_open > 0 and repeats / in_open >= DUPLICATE_SHARE
    assert ("identical_samples" in found) == stuck
    tokens = REPLY * sum(len(g) for g in groups)
    judged = logprob == CERTAIN and tokens >= MIN_TOKENS and not (multi and not open_groups)
    expect_warning = judged and (stuck or not multi)
    assert ("entropy_collapse" in found) == expect_warning
    assert ("low_entropy" in found) == (judged and not expect_warning)
