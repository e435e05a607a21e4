"""The beam search of one APO run: publish prompt versions, score them with rollouts, expand the
beam with the optimizer's critiques and edits, and report every version (see :mod:`.algorithm`)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from agentbolt import types as t
from agentbolt.algorithm import AlgorithmContext, batches

from .evaluation import Evaluation, evaluate_versions, failures_of
from .optimizer import (
    OptimizerClient,
    OptimizerError,
    critique_messages,
    edit_messages,
    parse_edited_prompt,
    placeholders,
)
from .result import APOResult, PromptVersion

if TYPE_CHECKING:
    from .algorithm import APO

__all__ = ["BeamSearch"]

log = logging.getLogger(__name__)


class BeamSearch:
    """The state of one APO run."""

    def __init__(self, apo: APO, ctx: AlgorithmContext, client: OptimizerClient) -> None:
        self.apo = apo
        self.ctx = ctx
        self.client = client
        self.versions: dict[int, PromptVersion] = {}
        self.malformed = 0
        self.limit = asyncio.Semaphore(apo.optimizer_concurrency)
        self.required = placeholders(apo.initial_prompt)
        self.val_groups: list[dict[int, float]] = []
        """Scores of versions measured on the same validation tasks, one dict per comparison."""
        self.val_cache: dict[tuple[int, tuple[str, ...]], float] = {}
        """(version, validation task ids) -> score: a version is never run twice on the same tasks."""
        self.all_val: tuple[str, ...] = ()

    async def publish(self, prompt: str, round_: int, parent: int | None, critique: str | None) -> int:
        apo = self.apo
        meta = {"run_id": self.ctx.run_id, "round": round_, "parent_version": parent, "critique": critique}
        stored = await self.ctx.publish(
            t.Resources(
                llm=t.LLMEndpoint(base_url=self.ctx.gateway_url, model=apo.model or "agentbolt", sampling=apo.sampling),
                prompts={**apo.other_prompts, apo.prompt_name: prompt},
                extra={"apo": meta},
            )
        )
        assert stored.version is not None
        self.versions[stored.version] = PromptVersion(stored.version, prompt, round_, parent, critique)
        return stored.version

    async def score_val(
        self, versions: Sequence[int], tasks: Sequence[t.Task], *, tag: str, step: int, what: str
    ) -> dict[int, float]:
        """Validation scores of ``versions`` on ``tasks``, running only those not measured on them
        yet; scores on the whole validation set are also each version's ``final_val_score``."""
        key = tuple(sorted(task.task_id for task in tasks))
        todo = [v for v in versions if (v, key) not in self.val_cache]
        if todo:
            out = await self.evaluate(todo, tasks, val=True, tag=tag, step=step, what=what)
            for v, ev in out.items():
                self.val_cache[(v, key)] = ev.score
        scores = {v: self.val_cache[(v, key)] for v in versions}
        if key == self.all_val:
            for v, score in scores.items():
                self.versions[v].final_val_score = score
        self.val_groups.append(scores)
        return scores

    async def evaluate(
        self, versions: Sequence[int], tasks: Sequence[t.Task], *, val: bool, tag: str, step: int, what: str
    ) -> dict[int, Evaluation]:
        mode = t.RolloutMode.VAL if val else t.RolloutMode.TRAIN
        out = await evaluate_versions(self.ctx, versions, tasks, mode=mode, tag=tag, step=step, description=what)
        for ev in out.values():
            if ev.failed or ev.no_reward:
                log.warning(
                    "APO %s: prompt version %d: %d of %d rollouts failed and %d reported no reward (scored as 0)",
                    tag,
                    ev.version,
                    ev.failed,
                    len(ev.rollouts),
                    ev.no_reward,
                )
        return out

    async def ask(self, messages: list[dict[str, str]], what: str) -> str | None:
        """The optimizer's answer, or ``None`` (logged) when it holds no text."""
        async with self.limit:
            try:
                return await self.client.complete(messages)
            except OptimizerError as exc:
                self.malformed += 1
                log.warning("APO: the optimizer's %s answer is unusable, skipped: %s", what, exc)
                return None

    async def expand(self, parent: int, evaluation: Evaluation) -> list[tuple[str, str]]:
        """Critique ``parent`` from its failures; return the usable (edited prompt, critique) pairs."""
        prompt = self.versions[parent].prompt
        failures = await failures_of(self.ctx, evaluation, self.apo.failure_threshold, len(evaluation.rollouts))
        if not failures:
            log.info("APO: prompt version %d reached the failure threshold on every task of the batch", parent)
            return []
        critique = await self.ask(critique_messages(prompt, failures), "critique")
        if critique is None:
            return []
        critique = critique.strip()
        answers = await asyncio.gather(
            *(self.ask(edit_messages(prompt, critique), "edit") for _ in range(self.apo.branch_factor))
        )
        edits = []
        for answer in answers:
            if answer is None:
                continue
            new = parse_edited_prompt(answer)
            if new is None:
                self.malformed += 1
                log.warning(
                    "APO: an edit of version %d holds no prompt between <prompt> and </prompt>; skipped. "
                    "The answer began: %r",
                    parent,
                    answer[:200],
                )
                continue
            missing = self.required - placeholders(new)
            if missing:
                self.malformed += 1
                log.warning("APO: an edit of version %d drops placeholder(s) %s; skipped", parent, sorted(missing))
                continue
            edits.append((new, critique))
        return edits

    def train_batches(self, train: list[t.Task]) -> Iterator[list[t.Task]]:
        for epoch in itertools.count():
            yield from batches(train, self.apo.train_batch_size, seed=self.apo.seed + epoch)

    async def run(self, train: list[t.Task], val: list[t.Task]) -> APOResult:
        apo, ctx = self.apo, self.ctx
        rng = random.Random(apo.seed)
        self.all_val = tuple(sorted(task.task_id for task in val))
        seed_version = await self.publish(apo.initial_prompt, 0, None, None)
        initial = await self.score_val([seed_version], val, tag="val-initial", step=0, what="APO: initial val")
        ctx.log_metrics(0, {"apo/val_score_best": initial[seed_version]})
        beam = [seed_version]
        train_iter = self.train_batches(train)
        for round_ in range(1, apo.rounds + 1):
            batch = next(train_iter)
            trained = await self.evaluate(
                beam, batch, val=False, tag=f"r{round_}-train", step=round_, what=f"APO round {round_}: train"
            )
            for v, ev in trained.items():
                self.versions[v].train_scores[round_] = ev.score
            expansions = await asyncio.gather(*(self.expand(v, trained[v]) for v in beam))
            known = {pv.prompt for pv in self.versions.values()}
            children = []
            for parent, edits in zip(beam, expansions, strict=True):
                for prompt, critique in edits:
                    if prompt in known:
                        log.info("APO: an edit of version %d repeats a known prompt; skipped", parent)
                        continue
                    known.add(prompt)
                    children.append(await self.publish(prompt, round_, parent, critique))
            candidates = beam + children
            val_batch = (
                val
                if apo.val_batch_size is None or apo.val_batch_size >= len(val)
                else rng.sample(val, apo.val_batch_size)
            )
            scored = await self.score_val(
                candidates, val_batch, tag=f"r{round_}-val", step=round_, what=f"APO round {round_}: val"
            )
            for v, score in scored.items():
                self.versions[v].val_scores[round_] = score
            beam = sorted(candidates, key=lambda v: (-scored[v], v))[: apo.beam_width]
            ctx.log_metrics(
                round_,
                {
                    "apo/val_score_best": scored[beam[0]],
                    "apo/train_score_beam": sum(ev.score for ev in trained.values()) / len(trained),
                    "apo/candidates": float(len(candidates)),
                    "apo/new_prompts": float(len(children)),
                },
            )
        return await self.finish(beam, val)

    async def finish(self, beam: list[int], val: list[t.Task]) -> APOResult:
        apo, ctx = self.apo, self.ctx
        # The final beam and the initial prompt on the whole validation set (cached scores are not rerun).
        final = sorted({min(self.versions), *beam})
        await self.score_val(final, val, tag="val-final", step=apo.rounds + 1, what="APO: final val")
        measured = [pv for pv in self.versions.values() if pv.final_val_score is not None]
        best = max(measured, key=lambda pv: (pv.final_val_score, -pv.version))
        seed = self.versions[min(self.versions)]
        assert seed.final_val_score is not None and best.final_val_score is not None
        warnings = []
        ignored = self.prompt_ignored()
        if ignored is not None:
            warnings.append(
                f"every prompt version scored {ignored:.2f} on the same validation tasks: "
                f"does the agent read resources.prompts[{apo.prompt_name!r}]?"
            )
        if len(self.versions) == 1:
            warnings.append(
                "the optimizer produced no usable edited prompt"
                + (f" ({self.malformed} answers were malformed)" if self.malformed else "")
                + ": the initial prompt is the result"
            )
        for w in warnings:
            log.warning("APO: %s", w)
        table = [pv.to_dict() for pv in sorted(self.versions.values(), key=lambda pv: pv.version)]
        published = await self.publish_best(best, seed, table, warnings)
        ctx.log_metrics(
            apo.rounds + 1,
            {
                "apo/val_score_initial": seed.final_val_score,
                "apo/val_score_final": best.final_val_score,
                "apo/published_version": float(published),
            },
        )
        result = APOResult(
            prompt_name=apo.prompt_name,
            best_prompt=best.prompt,
            best_version=best.version,
            published_version=published,
            score_before=seed.final_val_score,
            score_after=best.final_val_score,
            versions=sorted(self.versions.values(), key=lambda pv: pv.version),
            rounds=apo.rounds,
            optimizer_calls=self.client.calls,
            malformed_answers=self.malformed,
            prompt_ignored=ignored is not None,
            warnings=warnings,
        )
        log.info(
            "APO: held-out score %.3f -> %.3f; best prompt is version %d (published as version %d)",
            result.score_before,
            result.score_after,
            best.version,
            published,
        )
        return result

    def prompt_ignored(self) -> float | None:
        """The common score when every evaluation of several different prompts on the same
        validation tasks gave each the same score (the agent ignores the prompt), else ``None``."""
        groups = [g for g in self.val_groups if len(g) > 1]
        if not groups or any(len(set(g.values())) > 1 for g in groups):
            return None
        return next(iter(groups[-1].values()))

    async def publish_best(
        self, best: PromptVersion, seed: PromptVersion, table: list[dict[str, Any]], warnings: list[str]
    ) -> int:
        apo = self.apo
        stored = await self.ctx.publish(
            t.Resources(
                llm=t.LLMEndpoint(base_url=self.ctx.gateway_url, model=apo.model or "agentbolt", sampling=apo.sampling),
                prompts={**apo.other_prompts, apo.prompt_name: best.prompt},
                extra={
                    "apo": {
                        "run_id": self.ctx.run_id,
                        "prompt_name": apo.prompt_name,
                        "best": True,
                        "best_version": best.version,
                        "score_before": seed.final_val_score,
                        "score_after": best.final_val_score,
                        "versions": table,
                        "warnings": warnings,
                    }
                },
            )
        )
        assert stored.version is not None
        return stored.version
