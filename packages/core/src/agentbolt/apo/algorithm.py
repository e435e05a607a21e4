"""APO: automatic prompt optimization by beam search over prompt versions with textual gradients.

The prompt is a resource: APO publishes each prompt version as a resources version with the
prompt in ``resources.prompts[prompt_name]`` (``"system"`` by default), and the agent reads it
from there. That is the one change APO needs in an agent.

Each round:

1. every prompt of the beam runs on a batch of training tasks (real rollouts, rewards from the agent);
2. for each, the optimizer LLM critiques the prompt from the tasks it did badly on (the "textual
   gradient") and writes ``branch_factor`` edited prompts answering the critique; each becomes a
   new resources version whose ``extra["apo"]`` records its parent and the critique;
3. the beam and its children run on a batch of validation tasks; the best ``beam_width`` stay.

At the end the final beam runs on the whole validation set; the best prompt by held-out score
(the initial prompt included) is published once more as the last resources version, carrying the
table of every version, its scores and critique.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .. import types as t
from ..algorithm import Algorithm, AlgorithmContext, batches
from ..errors import UserError
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

__all__ = ["APO"]

log = logging.getLogger(__name__)


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"APO {name} must be a whole number of at least 1, got {value!r}")
    return value


def _number(name: str, value: Any, *, low: float, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < low:
        raise UserError(f"APO {name} must be a finite number of at least {low}, got {value!r}")
    if positive and value <= 0:
        raise UserError(f"APO {name} must be more than 0, got {value!r}")
    return float(value)


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"APO {name} must be a non-empty string, got {value!r}")
    return value


class APO(Algorithm):
    """Automatic prompt optimization (see the module docstring and docs/apo.md).

    Args:
        initial_prompt: the prompt to start from (published as ``resources.prompts[prompt_name]``).
        prompt_name: which prompt of the resources the agent reads.
        optimizer_base_url: OpenAI-compatible base URL of the optimizer LLM (``.../v1``).
        optimizer_model: the optimizer's model name.
        optimizer_api_key_env: environment variable with the optimizer's API key (``None``: no key).
        optimizer_temperature: sampling temperature of critiques and edits (diversity of children).
        optimizer_timeout_s: seconds to wait for one optimizer answer.
        optimizer_concurrency: optimizer requests at once.
        beam_width: prompts kept after each round.
        branch_factor: edited prompts asked for per beam prompt and round.
        rounds: beam search rounds.
        train_batch_size: training tasks each beam prompt runs on per round (their failures are critiqued).
        val_batch_size: validation tasks candidates are compared on per round (``None``: all).
        failure_threshold: rewards below this count as failures shown to the optimizer.
        model: policy model name published in ``resources.llm.model``.
        sampling: sampling parameters the gateway forces on the policy's calls.
        other_prompts: further prompts published unchanged with every version.
        seed: seed of batch sampling.
    """

    name = "apo"

    def __init__(
        self,
        initial_prompt: str,
        *,
        prompt_name: str = "system",
        optimizer_base_url: str = "https://api.openai.com/v1",
        optimizer_model: str = "gpt-4.1-mini",
        optimizer_api_key_env: str | None = "OPENAI_API_KEY",
        optimizer_temperature: float = 1.0,
        optimizer_timeout_s: float = 120.0,
        optimizer_concurrency: int = 4,
        beam_width: int = 2,
        branch_factor: int = 2,
        rounds: int = 2,
        train_batch_size: int = 4,
        val_batch_size: int | None = None,
        failure_threshold: float = 1.0,
        model: str | None = None,
        sampling: Mapping[str, Any] | None = None,
        other_prompts: Mapping[str, str] | None = None,
        seed: int = 0,
    ) -> None:
        self.initial_prompt = _text("initial_prompt", initial_prompt)
        self.prompt_name = _text("prompt_name", prompt_name)
        self.optimizer_base_url = _text("optimizer_base_url", optimizer_base_url)
        if not self.optimizer_base_url.startswith(("http://", "https://")):
            raise UserError(f"APO optimizer_base_url must start with http:// or https://, got {optimizer_base_url!r}")
        self.optimizer_model = _text("optimizer_model", optimizer_model)
        if optimizer_api_key_env is not None:
            _text("optimizer_api_key_env", optimizer_api_key_env)
        self.optimizer_api_key_env = optimizer_api_key_env
        self.optimizer_temperature = _number("optimizer_temperature", optimizer_temperature, low=0.0)
        self.optimizer_timeout_s = _number("optimizer_timeout_s", optimizer_timeout_s, low=0.0, positive=True)
        self.optimizer_concurrency = _positive_int("optimizer_concurrency", optimizer_concurrency)
        self.beam_width = _positive_int("beam_width", beam_width)
        self.branch_factor = _positive_int("branch_factor", branch_factor)
        self.rounds = _positive_int("rounds", rounds)
        self.train_batch_size = _positive_int("train_batch_size", train_batch_size)
        self.val_batch_size = None if val_batch_size is None else _positive_int("val_batch_size", val_batch_size)
        self.failure_threshold = _number("failure_threshold", failure_threshold, low=-math.inf)
        self.model = model
        self.sampling = dict(sampling or {})
        self.other_prompts = dict(other_prompts or {})
        if self.prompt_name in self.other_prompts:
            raise UserError(f"APO other_prompts must not contain the optimized prompt {self.prompt_name!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise UserError(f"APO seed must be an integer, got {seed!r}")
        self.seed = seed
        self._client: OptimizerClient | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> APO:
        """Build from keyword options (``Trainer(algorithm="apo", algorithm_config=...)``);
        an unknown or missing option is a :class:`UserError` listing the valid ones."""
        valid = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
        unknown = sorted(set(config) - set(valid))
        if unknown:
            raise UserError(f"unknown APO option(s) {', '.join(map(repr, unknown))}; valid options: {', '.join(valid)}")
        if "initial_prompt" not in config:
            raise UserError(
                "APO needs initial_prompt: the prompt to start from, e.g. "
                "Trainer(algorithm='apo', algorithm_config={'initial_prompt': 'You are ...', ...})"
            )
        return cls(**config)

    # -- the run ----------------------------------------------------------------------------------

    async def run(self, ctx: AlgorithmContext, train: Sequence[t.Task], val: Sequence[t.Task]) -> APOResult:
        if not train:
            raise UserError(
                "APO needs training tasks (their failures are what the optimizer critiques): fit(train, val)"
            )
        if not val:
            raise UserError("APO needs validation tasks to pick prompts by held-out score: fit(train, val)")
        self._client = OptimizerClient(
            self.optimizer_base_url,
            self.optimizer_model,
            api_key_env=self.optimizer_api_key_env,
            temperature=self.optimizer_temperature,
            timeout_s=self.optimizer_timeout_s,
        )
        search = _Search(self, ctx, self._client)
        return await search.run(list(train), list(val))

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()


class _Search:
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
        """Scores of versions measured on the same validation tasks, one dict per evaluation."""

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
        if val:
            self.val_groups.append({v: ev.score for v, ev in out.items()})
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
        seed_version = await self.publish(apo.initial_prompt, 0, None, None)
        initial = await self.evaluate([seed_version], val, val=True, tag="val-initial", step=0, what="APO: initial val")
        self.versions[seed_version].final_val_score = initial[seed_version].score
        ctx.log_metrics(0, {"apo/val_score_best": initial[seed_version].score})
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
            scored = await self.evaluate(
                candidates, val_batch, val=True, tag=f"r{round_}-val", step=round_, what=f"APO round {round_}: val"
            )
            for v, ev in scored.items():
                self.versions[v].val_scores[round_] = ev.score
            beam = sorted(candidates, key=lambda v: (-scored[v].score, v))[: apo.beam_width]
            ctx.log_metrics(
                round_,
                {
                    "apo/val_score_best": scored[beam[0]].score,
                    "apo/train_score_beam": sum(ev.score for ev in trained.values()) / len(trained),
                    "apo/candidates": float(len(candidates)),
                    "apo/new_prompts": float(len(children)),
                },
            )
        return await self.finish(beam, val)

    async def finish(self, beam: list[int], val: list[t.Task]) -> APOResult:
        apo, ctx = self.apo, self.ctx
        need = [v for v in beam if self.versions[v].final_val_score is None]
        if need:
            final = await self.evaluate(
                need, val, val=True, tag="val-final", step=apo.rounds + 1, what="APO: final val"
            )
            for v, ev in final.items():
                self.versions[v].final_val_score = ev.score
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
        published = await self.publish_best(best, seed, table)
        ctx.log_metrics(
            apo.rounds + 1, {"apo/val_score_initial": seed.final_val_score, "apo/val_score_final": best.final_val_score}
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

    async def publish_best(self, best: PromptVersion, seed: PromptVersion, table: list[dict[str, Any]]) -> int:
        apo = self.apo
        stored = await self.ctx.publish(
            t.Resources(
                llm=t.LLMEndpoint(base_url=self.ctx.gateway_url, model=apo.model or "agentbolt", sampling=apo.sampling),
                prompts={**apo.other_prompts, apo.prompt_name: best.prompt},
                extra={
                    "apo": {
                        "run_id": self.ctx.run_id,
                        "best": True,
                        "best_version": best.version,
                        "score_before": seed.final_val_score,
                        "score_after": best.final_val_score,
                        "versions": table,
                    }
                },
            )
        )
        assert stored.version is not None
        return stored.version
