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

import inspect
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from agentbolt import types as t
from agentbolt.algorithm import Algorithm, AlgorithmContext
from agentbolt.errors import UserError

from .beam import BeamSearch
from .optimizer import (
    OptimizerClient,
)
from .result import APOResult

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
        search = BeamSearch(self, ctx, self._client)
        return await search.run(list(train), list(val))

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
