"""``torch-sft``: fine-tuning on the agent's own successful rollouts, or on demonstrations.

Per step: publish the policy (same server, gateway and store as ``torch-grpo``), run a batch of
tasks ``group_size`` times each, turn the final attempts' spans into transitions with
LightningRL, keep the transitions of rollouts whose final reward is at least ``threshold``
(optionally only the ``best_k`` rollouts per task), and train on them with the negative
log-likelihood of the response tokens -- the exact token ids the gateway recorded, prompt tokens
masked out. A step with nothing to keep skips its update; a run where the first steps keep
nothing stops with a :class:`~agentbolt.errors.UserError` saying what to change.

    Trainer(agent, TorchSFT(model="smollm2", steps=5, threshold=1.0)).fit(train, val)

With ``demonstrations=`` (:mod:`agentbolt_torch.training.demonstrations`: calls of a stronger model, or
worked solutions played through the agent) nothing is sampled: each step trains on
``batch_size`` demonstration episodes, rendered with the policy's own tokenizer through the policy
server's chat rendering, so the policy learns exactly the sequences it will be served and parsed.

SFT then RL: give ``torch-grpo`` the SFT checkpoint's model directory,
``TorchGRPO(model="runs/torch-sft/checkpoint-final/model")`` (``docs/sft.md``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentbolt import types as t
from agentbolt.errors import UserError

from .algorithm import TorchGRPO, lightningrl_metrics
from .demonstrations import Demonstration, render_demonstrations

__all__ = ["TorchSFT", "model_dir_of", "select_transitions"]

log = logging.getLogger(__name__)


def select_transitions(
    rollouts: Sequence[t.Rollout],
    transitions: Sequence[t.Transition],
    *,
    threshold: float,
    best_k: int | None = None,
) -> list[t.Transition]:
    """The transitions worth imitating, each with advantage 1.0 (the NLL weight).

    A rollout is kept when its final reward is at least ``threshold``; with ``best_k``, only the
    ``best_k`` highest-reward kept rollouts of each task (ties: the earlier rollout).
    """
    kept: dict[str | None, list[t.Rollout]] = defaultdict(list)
    for r in rollouts:
        if r.final_reward is not None and r.final_reward >= threshold:
            kept[r.task_id].append(r)
    ids: set[str] = set()
    for group in kept.values():
        ranked = sorted(group, key=lambda r: -(r.final_reward or 0.0))
        ids.update(r.rollout_id for r in (ranked[:best_k] if best_k else ranked))
    return [tr.model_copy(update={"advantage": 1.0}) for tr in transitions if tr.rollout_id in ids]


def model_dir_of(init_from: str | Path) -> str:
    """The model directory whose weights start a run: an agentbolt-torch checkpoint's ``model/``
    (e.g. ``runs/torch-sft/checkpoint-final``) or a Hugging Face model directory as it is. Give
    the result to ``torch-grpo`` as its model to run RL from an SFT checkpoint."""
    source = Path(init_from)
    if (source / "model").is_dir():
        source = source / "model"
    if not (source / "config.json").is_file():
        raise UserError(
            f"init_from={init_from!s}: no model there (expected an agentbolt-torch checkpoint with "
            "model/ or a Hugging Face model directory; LoRA checkpoints: use resume=)"
        )
    return str(source)


class TorchSFT(TorchGRPO):
    """Rejection-sampling fine-tuning through the whole agentbolt pipeline.

    Takes :class:`~agentbolt_torch.training.algorithm.TorchGRPO`'s arguments (model, steps, batch_size,
    group_size, sampling, evaluation, update, policy, generation, output, seed; ``output.out_dir``
    defaults to ``runs/torch-sft``), and:

    Args:
        threshold: a rollout's transitions are trained on when its final reward is at least this.
        best_k: keep at most this many passing rollouts per task (``None``: all that pass).
        init_from: an agentbolt-torch checkpoint directory (or a Hugging Face model directory)
            whose weights start the run, e.g. a ``torch-grpo`` checkpoint; replaces ``model``.
        demonstrations: train on these instead of sampling (offline SFT): each step takes
            ``batch_size`` episodes (the calls sharing a :attr:`Demonstration.episode`), in
            shuffled epochs; ``threshold``, ``best_k`` and ``group_size`` then play no part. Calls
            that do not render (:func:`~agentbolt_torch.training.demonstrations.render_demonstration`)
            are skipped and counted (``train/skipped_calls``); a first step with none left
            stops the run with a :class:`~agentbolt.errors.UserError`.
    """

    name = "torch-sft"

    def __init__(
        self,
        model: str = "smollm2",
        *,
        threshold: float = 1.0,
        best_k: int | None = None,
        init_from: str | Path | None = None,
        demonstrations: Sequence[Demonstration] | None = None,
        update: Any = None,
        **options: Any,
    ) -> None:
        if best_k is not None and best_k < 1:
            raise UserError("best_k must be >= 1 (or None to keep every passing rollout)")
        if demonstrations is not None and not demonstrations:
            raise UserError("demonstrations is empty: give at least one Demonstration (or None to sample rollouts)")
        if init_from is not None:
            model = model_dir_of(init_from)
        update = dict(update) if isinstance(update, Mapping) else update
        if update is None:
            update = {"objective": "nll", "lr": 1e-5}
        elif isinstance(update, dict):
            update = {**update, "objective": "nll"}
        else:
            update = dataclasses.replace(update, objective="nll")
        super().__init__(model, update=update, **options)
        self.threshold = threshold
        self.best_k = best_k
        self.demonstrations = list(demonstrations) if demonstrations is not None else None

    _step_tag = "sft"
    _step_label = "SFT step"

    def _training_items(self, train: Sequence[t.Task]) -> Sequence[Any]:
        """With demonstrations: their episodes (lists of calls in call order); else the tasks."""
        if self.demonstrations is None:
            return train
        episodes: dict[str, list[Demonstration]] = defaultdict(list)
        for demo in self.demonstrations:
            episodes[demo.episode].append(demo)
        return [sorted(calls, key=lambda d: d.index) for calls in episodes.values()]

    async def _step_transitions(
        self, ctx: Any, policy: Any, step: int, batch: Sequence[Any], lrl: Any, *, first: bool
    ) -> tuple[list[t.Transition] | None, dict[str, float]]:
        """With demonstrations: the batch's episodes rendered for this policy (nothing sampled)."""
        if self.demonstrations is None:
            return await super()._step_transitions(ctx, policy, step, batch, lrl, first=first)
        started = time.monotonic()
        calls = [demo for episode in batch for demo in episode]
        transitions, skipped = render_demonstrations(
            policy.tokenizer, calls, max_len=policy.max_model_len, eos_token_id=policy.eos_token_ids[0]
        )
        for reason, n in skipped.items():
            log.warning("SFT step %d: skipped %d demonstration calls: %s", step, n, reason)
        values = {
            "train/episodes": float(len({tr.rollout_id for tr in transitions})),
            "train/skipped_calls": float(sum(skipped.values())),
            "train/response_tokens": float(sum(len(tr.response_ids) for tr in transitions)),
            "time/render_s": time.monotonic() - started,
        }
        if not transitions:
            reasons = "; ".join(f"{n} x {why}" for why, n in Counter(skipped).most_common())
            message = f"torch-sft step {step}: none of {len(calls)} demonstration calls renders ({reasons})"
            if first:
                raise UserError(message + ". Nothing was updated.")
            log.warning("%s; skipping this step's update", message)
            return None, values
        return transitions, values

    def _transitions_to_train(
        self,
        step: int,
        rollouts: Sequence[t.Rollout],
        spans: Mapping[str, Sequence[t.Span]],
        lrl: Any,
        *,
        first: bool,
        policy_version: int,
    ) -> tuple[list[Any], dict[str, float]] | None:
        """The transitions of the rollouts that pass ``threshold`` / ``best_k``; a first step with
        none stops the run with a :class:`~agentbolt.errors.UserError` (nothing to imitate)."""
        from agentbolt.lightningrl import EmptyBatchError

        try:
            processed = lrl.process(rollouts, spans, policy_version=policy_version)
            kept = select_transitions(rollouts, processed.transitions, threshold=self.threshold, best_k=self.best_k)
            report = lightningrl_metrics(processed)
        except EmptyBatchError:
            kept, report = [], {}
        if not kept:
            passing = sum(r.final_reward is not None and r.final_reward >= self.threshold for r in rollouts)
            message = (
                f"torch-sft step {step}: no transition to train on ({passing} of {len(rollouts)} rollouts "
                f"reached threshold={self.threshold}, best reward "
                f"{max((r.final_reward or 0.0 for r in rollouts), default=0.0):g})"
            )
            if first:
                raise UserError(
                    message + ". Nothing was updated. Lower threshold, raise group_size or temperature, "
                    "or start from a better policy (init_from=)."
                )
            log.warning("%s; skipping this step's update", message)
            return None
        return list(kept), {"train/kept_rollouts": float(len({tr.rollout_id for tr in kept})), **report}
