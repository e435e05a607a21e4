"""Training health: is the policy learning the task, or something else? Read from a run's rollouts
and their recorded LLM calls, so it works for every algorithm and backend.

The checks compare the run's **first** training steps with its **last** (each a window of a
quarter of the run's steps, at least one). Training rollouts are the subject; held-out (``val``)
rollouts are only the yardstick. "Rising" and "flat" are measured against the run's own noise:
training rewards are averaged per group (one task's samples), so a window's standard error is
the spread of its group means over the square root of their number; held-out rewards are paired
by task between the first and the last evaluation (the same tasks), so the change's standard
error is the spread of the per-task differences over the square root of their number.

- ``reward_without_heldout_gain`` (warning, the reward-hacking alarm): the training reward rose by
  more than two standard errors, the held-out reward did not, and the held-out gain is more than
  two standard errors below the training gain. The policy earns reward on the training tasks
  without getting better at the task: it may exploit the reward function or memorise tasks.
  ``heldout_inconclusive`` (info): the same, except that the held-out set is too small to tell the
  two gains apart. ``no_heldout`` (info): the reward rose and nothing was held out to check it.
- A group is **solved** when every one of its samples earned full reward (at least
  :data:`SOLVED_REWARD`, 1.0: a task done right, as the examples' rewards and accuracy count it).
  Samples of a solved group agreeing is what learning aims at, not a collapse; the sampling checks
  below count the groups still to learn ("open" groups). A reward on another scale never counts a
  group solved (a run whose training rewards go above 1.0 counts none solved), so every group stays
  open, as before.
- ``identical_samples`` (warning): at least half of the samples of the last steps' open groups
  repeat, token for token, an earlier sample of their group; such groups have zero advantage.
- ``entropy_collapse`` (warning): in the last steps the sampled response tokens had a mean
  -log p of at most 0.1 nats, or at least 95 % of them had probability >= 0.99, under the policy
  (the logprobs the gateway recorded: vLLM and agentbolt-torch report the policy's own
  distribution, at temperature 1, so at T = 1 the mean -log p estimates the policy's entropy),
  **and** the samples of open groups stopped differing (the ``identical_samples`` share; without
  groups of several samples, the tokens alone decide). The policy has become nearly
  deterministic: group advantages vanish, learning stops. ``low_entropy`` (info): the tokens are
  as certain, but open groups' samples still differ: short replies in a fixed wording
  (``12 + 5 = 17. <answer>17</answer>``: one uncertain number in about 19 tokens) have a low mean
  -log p per token while their samples still disagree where it matters.
- ``tools_never_called`` (warning): the agent offered tools in the first and last steps and no
  rollout called one. ``tool_calls_dropped`` (warning): the share of rollouts that call a tool
  fell by more than two standard errors.

:func:`diagnose_run` computes a :class:`RunHealth` from rollouts and spans already loaded
(``agentbolt doctor``); :func:`run_health` loads only the windows it needs from a store (the
dashboard's run page); :func:`step_metrics` gives one step's numbers, which algorithms record as
``health/*`` metrics (agentbolt-torch does).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import semconv
from .. import types as t
from ..lightningrl.spans import is_gateway_call, parse_json_attr
from ..store.base import Store
from ..store.run_records import RolloutSearch
from .findings import Finding
from .quarantine import quarantine_finding, quarantined_in_metrics

__all__ = [
    "COLLAPSE_SHARE",
    "COLLAPSE_SURPRISAL",
    "DUPLICATE_SHARE",
    "MIN_TOKENS",
    "NEAR_CERTAIN_P",
    "SOLVED_REWARD",
    "HeldOut",
    "RunHealth",
    "Window",
    "Z",
    "diagnose_run",
    "run_health",
    "step_metrics",
]

Z = 2.0
"""How many standard errors make a change "real"."""
NEAR_CERTAIN_P = 0.99
"""A sampled token is near-certain when the policy gave it at least this probability."""
COLLAPSE_SHARE = 0.95
"""``entropy_collapse`` fires when at least this share of the last steps' tokens is near-certain..."""
COLLAPSE_SURPRISAL = 0.1
"""... or when their mean -log p (nats per token) is at most this."""
DUPLICATE_SHARE = 0.5
"""``identical_samples`` fires when at least this share of the last steps' samples of open (not
solved) groups repeats one of its group."""
SOLVED_REWARD = 1.0
"""A group whose samples all earned at least this reward is solved: its samples may agree."""
MIN_TOKENS = 50
"""Fewer sampled tokens (with logprobs) than this in a window: no entropy finding."""

_NEAR_CERTAIN_LOGPROB = math.log(NEAR_CERTAIN_P)


@dataclass(frozen=True)
class _Sample:
    """What the checks need of one rollout (its final attempt)."""

    group: str
    task: str
    step: int
    reward: float
    response: tuple[tuple[int, ...], ...]
    tokens: int
    near_certain: int
    surprisal: float
    offered_tools: bool
    called_tools: bool


def _offers_tools(span: t.Span) -> bool:
    request = parse_json_attr(span, semconv.LLM_REQUEST)
    return isinstance(request, dict) and bool(request.get("tools"))


def _calls_tools(span: t.Span) -> bool:
    reasons = span.attributes.get(semconv.GEN_AI_RESPONSE_FINISH_REASONS)
    if isinstance(reasons, list | tuple) and "tool_calls" in reasons:
        return True
    messages = parse_json_attr(span, semconv.GEN_AI_OUTPUT_MESSAGES)
    for m in messages if isinstance(messages, list) else []:
        if not isinstance(m, dict):
            continue
        if m.get("tool_calls") or any(
            isinstance(p, dict) and p.get("type") == "tool_call" for p in m.get("parts") or ()
        ):
            return True
    return False


def _sample(rollout: t.Rollout, spans: Iterable[t.Span]) -> _Sample:
    """``spans``: the rollout's spans; only its final attempt's successful LLM calls count."""
    final = rollout.current_attempt_id
    calls = [
        s
        for s in spans
        if is_gateway_call(s) and (final is None or s.attempt_id == final) and s.status.code is not t.StatusCode.ERROR
    ]
    calls.sort(key=lambda s: s.seq or 0)
    response: list[tuple[int, ...]] = []
    tokens = near = 0
    surprisal = 0.0
    for s in calls:
        ids = s.attributes.get(semconv.RESPONSE_TOKEN_IDS)
        response.append(tuple(int(i) for i in ids) if isinstance(ids, list | tuple) else ())
        logprobs = s.attributes.get(semconv.RESPONSE_LOGPROBS)
        for lp in logprobs if isinstance(logprobs, list | tuple) else ():
            if isinstance(lp, int | float) and math.isfinite(lp):
                tokens += 1
                near += lp >= _NEAR_CERTAIN_LOGPROB
                surprisal -= float(lp)
    return _Sample(
        group=rollout.group_id or rollout.rollout_id,
        task=rollout.task_id or rollout.rollout_id,
        step=rollout.step if rollout.step is not None else 0,
        reward=rollout.final_reward if rollout.final_reward is not None else 0.0,
        response=tuple(response),
        tokens=tokens,
        near_certain=near,
        surprisal=surprisal,
        offered_tools=any(_offers_tools(s) for s in calls),
        called_tools=any(_calls_tools(s) for s in calls),
    )


def _mean_se(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and standard error of the mean (``None`` when it cannot be estimated)."""
    if not values:
        return None, None
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    return mean, statistics.stdev(values) / math.sqrt(len(values))


@dataclass(frozen=True)
class Window:
    """Training rollouts of consecutive steps, summarized."""

    first_step: int
    last_step: int
    rollouts: int
    groups: int
    reward: float | None
    """Mean final reward (a rollout without one counts 0, as algorithms train on it)."""
    reward_se: float | None
    """Standard error of :attr:`reward` over group means."""
    tokens: int
    """Sampled response tokens with a recorded logprob."""
    near_certain_share: float | None
    """Share of those the policy gave probability >= :data:`NEAR_CERTAIN_P`."""
    surprisal: float | None
    """Mean -logprob per sampled token (nats): the policy's entropy at temperature 1, estimated."""
    multi_groups: int
    """Groups of two samples or more (samples that generated tokens)."""
    identical_groups: int
    """Of those, groups whose samples are all the same."""
    duplicate_share: float | None
    """Share of the samples of multi-sample groups that repeat an earlier sample of their group."""
    solved_groups: int
    """Multi-sample groups whose samples all earned at least :data:`SOLVED_REWARD`."""
    open_identical_groups: int
    """Multi-sample groups not solved whose samples are all the same."""
    open_duplicate_share: float | None
    """:attr:`duplicate_share` over the groups not solved (``None``: no such group)."""
    tool_rollouts: int
    """Rollouts that offered the model tools."""
    tool_call_rate: float | None
    """Share of those that called at least one."""
    tool_call_rate_se: float | None

    @property
    def steps(self) -> str:
        return str(self.first_step) if self.first_step == self.last_step else f"{self.first_step}-{self.last_step}"


def _window(samples: Sequence[_Sample], *, solvable: bool = True) -> Window:
    """The checks' numbers over ``samples``; with ``solvable`` false (a run whose rewards go above
    :data:`SOLVED_REWARD`, on another scale) no group counts solved."""
    groups: dict[str, list[_Sample]] = {}
    for s in samples:
        groups.setdefault(s.group, []).append(s)
    reward, reward_se = _mean_se([statistics.fmean(x.reward for x in g) for g in groups.values()])
    tokens = sum(s.tokens for s in samples)
    answered = [[x for x in g if any(x.response)] for g in groups.values()]  # samples that generated tokens
    multi = [g for g in answered if len(g) >= 2]
    duplicates = sum(len(g) - len({x.response for x in g}) for g in multi)
    in_multi = sum(len(g) for g in multi)
    solved: list[list[_Sample]] = []
    unsolved: list[list[_Sample]] = []
    for g in multi:
        (solved if solvable and all(x.reward >= SOLVED_REWARD for x in g) else unsolved).append(g)
    in_open = sum(len(g) for g in unsolved)
    open_duplicates = sum(len(g) - len({x.response for x in g}) for g in unsolved)
    tool_groups = [[x for x in g if x.offered_tools] for g in groups.values()]
    tool_groups = [g for g in tool_groups if g]
    rate, rate_se = _mean_se([statistics.fmean(float(x.called_tools) for x in g) for g in tool_groups])
    return Window(
        first_step=min((s.step for s in samples), default=0),
        last_step=max((s.step for s in samples), default=0),
        rollouts=len(samples),
        groups=len(groups),
        reward=reward,
        reward_se=reward_se,
        tokens=tokens,
        near_certain_share=sum(s.near_certain for s in samples) / tokens if tokens else None,
        surprisal=sum(s.surprisal for s in samples) / tokens if tokens else None,
        multi_groups=len(multi),
        identical_groups=sum(1 for g in multi if len({x.response for x in g}) == 1),
        duplicate_share=duplicates / in_multi if in_multi else None,
        solved_groups=len(solved),
        open_identical_groups=sum(1 for g in unsolved if len({x.response for x in g}) == 1),
        open_duplicate_share=open_duplicates / in_open if in_open else None,
        tool_rollouts=sum(len(g) for g in tool_groups),
        tool_call_rate=rate,
        tool_call_rate_se=rate_se,
    )


@dataclass(frozen=True)
class HeldOut:
    """The held-out reward at the run's first and last evaluation."""

    first_step: int
    last_step: int
    tasks: int
    """Tasks compared (paired: evaluated both times)."""
    paired: bool
    before: float
    after: float
    delta_se: float | None
    """Standard error of ``after - before``."""

    @property
    def delta(self) -> float:
        return self.after - self.before


def _held_out(samples: Sequence[_Sample]) -> HeldOut | None:
    steps = sorted({s.step for s in samples})
    if len(steps) < 2:
        return None
    first, last = steps[0], steps[-1]

    def per_task(step: int) -> dict[str, float]:
        rewards: dict[str, list[float]] = {}
        for s in samples:
            if s.step == step:
                rewards.setdefault(s.task, []).append(s.reward)
        return {k: statistics.fmean(v) for k, v in rewards.items()}

    a, b = per_task(first), per_task(last)
    common = sorted(a.keys() & b.keys())
    if len(common) >= 2:
        diffs = [b[k] - a[k] for k in common]
        return HeldOut(
            first,
            last,
            len(common),
            True,
            statistics.fmean(a[k] for k in common),
            statistics.fmean(b[k] for k in common),
            statistics.stdev(diffs) / math.sqrt(len(diffs)),
        )
    before, se_a = _mean_se(list(a.values()))
    after, se_b = _mean_se(list(b.values()))
    if before is None or after is None:
        return None
    se = math.hypot(se_a, se_b) if se_a is not None and se_b is not None else None
    return HeldOut(first, last, min(len(a), len(b)), False, before, after, se)


def _significant(delta: float, se: float | None) -> bool:
    """``delta`` is above ``Z`` standard errors (a zero error: any positive change)."""
    return se is not None and delta > 0 and delta > Z * se


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


@dataclass
class RunHealth:
    """The training-health report of one run."""

    run_id: str
    first: Window | None = None
    last: Window | None = None
    held_out: HeldOut | None = None
    findings: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """The numbers, one line per check (first steps -> last steps)."""
        f, last, h = self.first, self.last, self.held_out
        if f is None or last is None:
            return [f"training health of {self.run_id}: no training steps recorded"]

        def reward(w: Window) -> str:
            return (
                "-"
                if w.reward is None
                else f"{w.reward:.3f}" + ("" if w.reward_se is None else f" ± {w.reward_se:.3f}")
            )

        out = [
            f"training health of {self.run_id}: steps {f.steps} -> {last.steps} "
            f"({f.rollouts} and {last.rollouts} training rollouts)",
            f"  training reward {reward(f)} -> {reward(last)}",
        ]
        if h is not None:
            se = "" if h.delta_se is None else f" ± {h.delta_se:.3f}"
            out.append(
                f"  held-out reward {h.before:.3f} -> {h.after:.3f} ({h.delta:+.3f}{se}; {h.tasks} tasks"
                f"{' paired' if h.paired else ''}, steps {h.first_step} and {h.last_step})"
            )
        else:
            out.append("  held-out reward: fewer than two evaluations")
        out.append(
            f"  tokens with p >= {NEAR_CERTAIN_P}: {_pct(f.near_certain_share)} -> {_pct(last.near_certain_share)}"
            + (
                f" (mean -log p {f.surprisal:.3f} -> {last.surprisal:.3f} nats)"
                if f.surprisal is not None and last.surprisal is not None
                else ""
            )
        )
        out.append(
            f"  samples repeating one of their group: {_pct(f.duplicate_share)} -> {_pct(last.duplicate_share)}"
            f" (in groups not solved: {_pct(f.open_duplicate_share)} -> {_pct(last.open_duplicate_share)};"
            f" solved groups {f.solved_groups} -> {last.solved_groups})"
        )
        if f.tool_rollouts or last.tool_rollouts:
            out.append(f"  rollouts calling a tool: {_pct(f.tool_call_rate)} -> {_pct(last.tool_call_rate)}")
        return out


def _windows(train: Sequence[_Sample]) -> tuple[list[_Sample], list[_Sample]]:
    first_step = min(s.step for s in train)
    last_step = max(s.step for s in train)
    width = max(1, (last_step - first_step + 1) // 4)
    return (
        [s for s in train if s.step < first_step + width],
        [s for s in train if s.step > last_step - width],
    )


def _check_reward(run_id: str, first: Window, last: Window, held: HeldOut | None) -> list[Finding]:
    if first.reward is None or last.reward is None or first.reward_se is None or last.reward_se is None:
        return []
    gain, se = last.reward - first.reward, math.hypot(first.reward_se, last.reward_se)
    if first.last_step >= last.first_step or not _significant(gain, se):
        return []
    rise = (
        f"the training reward rose {first.reward:.3f} -> {last.reward:.3f} ({gain:+.3f} ± {se:.3f} SE) "
        f"from steps {first.steps} to {last.steps}"
    )
    if held is None:
        return [
            Finding(
                "no_heldout",
                "info",
                last.rollouts,
                f"{rise}; nothing held out was evaluated twice, so it cannot be checked against unseen tasks",
                "evaluate held-out tasks before and after training (fit(train, val))",
                run_id,
            )
        ]
    if _significant(held.delta, held.delta_se):
        return []
    hse = held.delta_se if held.delta_se is not None else math.inf  # one held-out task: its noise is unknown
    gap, gap_se = gain - held.delta, math.hypot(se, hse)
    noise = f" ± {hse:.3f} SE" if held.delta_se is not None else ""
    seen = (
        f"while the held-out reward went {held.before:.3f} -> {held.after:.3f} ({held.delta:+.3f}{noise}, "
        f"{held.tasks} tasks, steps {held.first_step} and {held.last_step})"
    )
    if gap > Z * gap_se:
        return [
            Finding(
                "reward_without_heldout_gain",
                "warning",
                last.rollouts,
                f"{rise} {seen}: the policy earns reward on training tasks without getting better at unseen ones "
                "(reward hacking or memorisation)",
                "read rollouts of the last steps for answers that score without solving the task (agentbolt rollouts "
                "list --run RUN --step N); tighten the reward; make sure held-out tasks are like the training ones",
                run_id,
            )
        ]
    return [
        Finding(
            "heldout_inconclusive",
            "info",
            held.tasks,
            f"{rise} {seen}: the held-out set is too small to tell whether it followed",
            "evaluate on more held-out tasks (or more samples per task) to see whether the gain generalizes",
            run_id,
        )
    ]


def _check_sampling(run_id: str, first: Window, last: Window) -> list[Finding]:
    out: list[Finding] = []
    share, surprisal, repeats = last.near_certain_share, last.surprisal, last.open_duplicate_share
    stuck = repeats is not None and repeats >= DUPLICATE_SHARE
    solved = f", {last.solved_groups} solved groups aside" if last.solved_groups else ""
    if (
        share is not None
        and surprisal is not None
        and last.tokens >= MIN_TOKENS
        and (share >= COLLAPSE_SHARE or surprisal <= COLLAPSE_SURPRISAL)
        and (last.multi_groups == 0 or last.solved_groups < last.multi_groups)  # not everything solved
    ):
        before = (
            f"; steps {first.steps}: {_pct(first.near_certain_share)}, {first.surprisal:.3f} nats"
            if first is not last and first.surprisal is not None
            else ""
        )
        certain = (
            f"in steps {last.steps}, {share:.1%} of {last.tokens:,} sampled response tokens had p >= "
            f"{NEAR_CERTAIN_P} under the policy (mean -log p {surprisal:.3f} nats per token{before})"
        )
        if stuck or repeats is None:
            differ = "" if repeats is None else f" and {repeats:.0%} of the samples repeat one of their group{solved}"
            out.append(
                Finding(
                    "entropy_collapse",
                    "warning",
                    round(share * last.tokens),
                    f"{certain}{differ}: the policy samples almost deterministically, so its samples stop differing "
                    "and learning stalls",
                    "lower the learning rate, add a KL penalty to the reference (agentbolt-torch: "
                    "update={'kl_coef': ...}) or an entropy bonus (entropy_coef); use the checkpoint from before "
                    "the collapse",
                    run_id,
                )
            )
        else:
            out.append(
                Finding(
                    "low_entropy",
                    "info",
                    round(share * last.tokens),
                    f"{certain}, yet only {repeats:.0%} of the samples of groups not solved repeat one of their group"
                    f"{solved}: the certain tokens are the replies' fixed wording, the samples still differ",
                    "nothing to do while the held-out score holds; if the share of repeated samples climbs, see "
                    "entropy_collapse",
                    run_id,
                )
            )
    if stuck:
        assert repeats is not None
        out.append(
            Finding(
                "identical_samples",
                "warning",
                last.open_identical_groups,
                f"in steps {last.steps}, {repeats:.0%} of the samples of groups not solved repeat an earlier sample of "
                f"their group token for token ({last.open_identical_groups} of "
                f"{last.multi_groups - last.solved_groups} such groups are all alike{solved}): "
                "a group of identical samples has zero advantage and teaches nothing",
                "restore diversity: a higher sampling temperature, a smaller learning rate, a KL penalty "
                "(see entropy_collapse)",
                run_id,
            )
        )
    return out


def _check_tools(run_id: str, first: Window, last: Window) -> list[Finding]:
    if not last.tool_rollouts or last.tool_call_rate is None:
        return []
    if first.tool_rollouts and first.tool_call_rate == 0 and last.tool_call_rate == 0:
        n = first.tool_rollouts + last.tool_rollouts if first is not last else last.tool_rollouts
        return [
            Finding(
                "tools_never_called",
                "warning",
                n,
                f"tools were offered in {n} training rollouts of steps {first.steps} and {last.steps} and none called "
                "one: the policy answers without its tools, and RL cannot reinforce a behaviour it never samples",
                "check that the tool schema reaches the model (its chat template renders tools), then warm-start with "
                "demonstrations of tool use (torch-sft, docs/sft.md) or reward tool calls",
                run_id,
            )
        ]
    if first.tool_call_rate is not None and first.tool_call_rate_se is not None and last.tool_call_rate_se is not None:
        drop = first.tool_call_rate - last.tool_call_rate
        se = math.hypot(first.tool_call_rate_se, last.tool_call_rate_se)
        if first.last_step < last.first_step and _significant(drop, se):
            return [
                Finding(
                    "tool_calls_dropped",
                    "warning",
                    last.tool_rollouts,
                    f"the share of training rollouts calling a tool fell {first.tool_call_rate:.0%} -> "
                    f"{last.tool_call_rate:.0%} ({-drop:+.2f} ± {se:.2f} SE) from steps {first.steps} to {last.steps}",
                    "if the task needs the tool, reward its use (or penalize answers without it) and check the "
                    "reward of rollouts that skip it",
                    run_id,
                )
            ]
    return []


def diagnose_run(run_id: str, rollouts: Sequence[t.Rollout], spans: Mapping[str, Sequence[t.Span]]) -> RunHealth:
    """The training health of ``run_id`` from its finished rollouts (training and held-out) and
    their spans (any attempts: the final one's are used). Rollouts without a step are ignored."""
    done = [r for r in rollouts if r.status.is_final and r.step is not None]
    samples = {r.rollout_id: _sample(r, spans.get(r.rollout_id, ())) for r in done}
    train = [samples[r.rollout_id] for r in done if r.mode is t.RolloutMode.TRAIN]
    val = [samples[r.rollout_id] for r in done if r.mode is t.RolloutMode.VAL]
    health = RunHealth(run_id, held_out=_held_out(val))
    if not train:
        return health
    first_samples, last_samples = _windows(train)
    # on another reward scale (a 0-10 grade, a count of tests passed) full reward is not 1.0: no group counts solved
    solvable = all(s.reward <= SOLVED_REWARD for s in train)
    first, last = _window(first_samples, solvable=solvable), _window(last_samples, solvable=solvable)
    if first.first_step == last.first_step:
        first = last  # one step: nothing to compare over time
    health.first, health.last = first, last
    health.findings = [
        *_check_reward(run_id, first, last, health.held_out),
        *_check_sampling(run_id, first, last),
        *_check_tools(run_id, first, last),
    ]
    return health


def step_metrics(rollouts: Sequence[t.Rollout], spans: Mapping[str, Sequence[t.Span]]) -> dict[str, float]:
    """One step's sampling-health numbers, to record as metrics: ``health/near_certain_share``,
    ``health/surprisal`` (mean -logprob per sampled token), ``health/duplicate_share`` and, when
    tools were offered, ``health/tool_call_rate`` (see :class:`Window`)."""
    w = _window([_sample(r, spans.get(r.rollout_id, ())) for r in rollouts])
    values = {
        "health/near_certain_share": w.near_certain_share,
        "health/surprisal": w.surprisal,
        "health/duplicate_share": w.duplicate_share,
        "health/tool_call_rate": w.tool_call_rate,
    }
    return {k: v for k, v in values.items() if v is not None}


async def _rollouts_at(store: Store, run_id: str, mode: t.RolloutMode, steps: Iterable[int]) -> list[t.Rollout]:
    out: list[t.Rollout] = []
    for step in steps:
        offset = 0
        while True:
            page = await store.search_rollouts(
                RolloutSearch(run_id=run_id, mode=mode, step=step, limit=1000, offset=offset)
            )
            out += page.items
            offset += len(page.items)
            if not page.items or offset >= page.total:
                break
    return out


async def _step_range(store: Store, run_id: str, mode: t.RolloutMode) -> tuple[int, int] | None:
    newest = await store.search_rollouts(RolloutSearch(run_id=run_id, mode=mode, limit=1))
    if not newest.total:
        return None
    oldest = await store.search_rollouts(RolloutSearch(run_id=run_id, mode=mode, limit=1, offset=newest.total - 1))
    steps = [r.step for r in (*newest.items, *oldest.items) if r.step is not None]
    return (min(steps), max(steps)) if steps else None


async def run_health(store: Store, run_id: str) -> RunHealth:
    """:func:`diagnose_run` of a stored run, reading only the rollouts it compares: the first and
    last windows of training steps and the first and last held-out evaluations."""
    wanted: list[t.Rollout] = []
    train = await _step_range(store, run_id, t.RolloutMode.TRAIN)
    if train is not None:
        first, last = train
        width = max(1, (last - first + 1) // 4)
        steps = sorted({*range(first, first + width), *range(last - width + 1, last + 1)})
        wanted += await _rollouts_at(store, run_id, t.RolloutMode.TRAIN, steps)
    val = await _step_range(store, run_id, t.RolloutMode.VAL)
    if val is not None:
        wanted += await _rollouts_at(store, run_id, t.RolloutMode.VAL, sorted(set(val)))
    spans: dict[str, list[t.Span]] = {}
    ids = [r.rollout_id for r in wanted]
    for i in range(0, len(ids), 200):
        spans.update(await store.query_spans(ids[i : i + 200], latest_attempt_only=True))
    health = diagnose_run(run_id, wanted, spans)
    quarantined = quarantine_finding(run_id, quarantined_in_metrics(await store.get_run_metrics(run_id)))
    if quarantined is not None:
        health.findings.append(quarantined)
    return health
