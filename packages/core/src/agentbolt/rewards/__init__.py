"""Reward functions that are not part of the agent: LLM judges.

- :class:`LLMJudge`: a judge over any OpenAI-compatible endpoint: absolute rubric scores
  (:meth:`~LLMJudge.score`) and RULER-style relative scores of a group of trajectories for the
  same task (:meth:`~LLMJudge.rank`), with caching, retries, a cost counter and malformed answers
  counted (never raised);
- :class:`Trajectory` / :func:`trajectory_from_spans`: what a judge reads;
- :func:`judged`: a judge as the reward of an agent trained offline (``Trainer.fit``);
- ``agentbolt serve`` uses the same judge for sessions nobody rated (:mod:`agentbolt.online`).

The prompts and the parsing are :mod:`agentbolt.rewards.prompts`.
"""

from __future__ import annotations

from .judge import JudgeCache, JudgeScore, JudgeUsage, LLMJudge
from .offline import judged, task_text
from .prompts import DEFAULT_RUBRIC, MalformedJudgement
from .trajectory import Trajectory, trajectory_from_spans

__all__ = [
    "DEFAULT_RUBRIC",
    "JudgeCache",
    "JudgeScore",
    "JudgeUsage",
    "LLMJudge",
    "MalformedJudgement",
    "Trajectory",
    "judged",
    "task_text",
    "trajectory_from_spans",
]
