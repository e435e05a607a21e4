"""Option groups shared by :class:`~agentbolt.trainer.Trainer` and the ``agentbolt`` command line.

Each option is spelled once, here, and the trainer and the CLI build the gateway, what it
captures and the runners from these objects through the same methods::

    Trainer(
        agent,
        "torch-grpo",
        runners=RunnerOptions(n=2, concurrency=16),
        gateway=GatewayOptions(upstreams=["http://127.0.0.1:8000/v1"]),
        capture=CaptureOptions(agent_names={"planner": "You plan", "solver": re.compile("^You solve")}),
    )

A mapping of the fields works wherever an options object does (``runners={"n": 0}``); a wrong
field name or value type is a :class:`~agentbolt.errors.UserError` naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from . import types as t
from .capture.retokenize import ChatTemplateRetokenizer
from .capture.roles import AgentNamer, as_agent_namer
from .errors import UserError, invalid_fields_message
from .gateway import Gateway, GatewayThread, Upstream
from .runners.pool import RunnerPool
from .runners.ray import RayRunnerPool, RayWorkerOptions, options_from_mapping
from .runners.runner import AgentLike, RunnerConfig
from .store.base import Store

__all__ = ["CaptureOptions", "GatewayOptions", "OptionGroup", "RunOptions", "RunnerOptions"]


class OptionGroup(BaseModel):
    """Base of the option groups (here and :mod:`agentbolt.online.options`): frozen, and a wrong
    field name or value is a :class:`~agentbolt.errors.UserError` naming the valid fields."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    @classmethod
    def coerce(cls, value: Self | Mapping[str, Any], /, *, option: str) -> Self:
        """The options from an instance or a mapping of its fields; ``option`` names the
        argument in errors (``runners``)."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise UserError(
                f"{option}= takes {cls.__name__}(...) or a mapping of its fields "
                f"({', '.join(cls.model_fields)}), got {type(value).__name__}"
            )
        return cls(**value)

    def __init__(self, **fields: Any) -> None:
        try:
            super().__init__(**fields)
        except ValidationError as exc:
            unknown = f"unknown option; valid: {', '.join(type(self).model_fields)}"
            raise UserError(invalid_fields_message(f"invalid {type(self).__name__}", exc, unknown=unknown)) from None


class _Options(OptionGroup):
    @classmethod
    def from_value(cls, value: Self | Mapping[str, Any] | None, /, *, option: str) -> Self:
        """The options from an instance, a mapping of its fields or ``None`` (the defaults)."""
        return cls() if value is None else cls.coerce(value, option=option)


class CaptureOptions(_Options):
    """What the gateway and the runners record besides each call's exact token ids."""

    token_ids: Literal["exact", "retokenize"] = "exact"
    """``"exact"``: the backend's own ids (calls without them are recorded as ``missing``);
    ``"retokenize"``: calls whose backend returns no ids get ids rebuilt with ``tokenizer``
    and checked for drift (see :mod:`agentbolt.capture.retokenize`)."""
    tokenizer: Any = None
    """The policy's tokenizer for ``token_ids="retokenize"``: a Hugging Face name or path, or a
    tokenizer object."""
    agent_names: Any = None
    """Name agents from what calls carry, without changing the agent: a mapping agent name ->
    system-prompt substring or ``re.compile(...)`` pattern, an
    :class:`~agentbolt.capture.roles.AgentRoles`, or a function of the request."""
    adapters: list[str] | None = None
    """Framework adapters the runners instrument: ``None`` every installed one, ``[]`` none."""

    @field_validator("agent_names")
    @classmethod
    def _namer(cls, value: Any) -> AgentNamer | None:
        return as_agent_namer(value)

    @model_validator(mode="after")
    def _tokenizer_for_retokenize(self) -> CaptureOptions:
        if self.token_ids == "retokenize" and self.tokenizer is None:
            raise ValueError(
                "token_ids='retokenize' needs the policy's tokenizer: tokenizer='org/model' "
                "(a Hugging Face name or path) or a tokenizer object"
            )
        return self

    def gateway_options(self) -> dict[str, Any]:
        """The :class:`~agentbolt.gateway.Gateway` keywords for this capture (loads the tokenizer
        for ``"retokenize"``)."""
        options: dict[str, Any] = {"agent_names": self.agent_names}
        if self.token_ids == "retokenize":
            options["retokenize"] = (
                ChatTemplateRetokenizer.from_pretrained(self.tokenizer)
                if isinstance(self.tokenizer, str)
                else ChatTemplateRetokenizer(self.tokenizer)
            )
        return options


class GatewayOptions(_Options):
    """Where the gateway listens and where it forwards."""

    upstreams: tuple[str | Upstream, ...] = ()
    """OpenAI-compatible endpoints the gateway starts with (a URL, an
    :class:`~agentbolt.gateway.Upstream`, or several); algorithms that serve their own policy
    set them themselves."""
    host: str = "127.0.0.1"
    """Address to listen on; anything but loopback requires ``token``."""
    port: int = Field(default=0, ge=0, le=65535)
    """Port to listen on (0 picks a free one)."""
    token: str | None = None
    """Bearer token agents send as their API key."""
    upstream_timeout_s: float = 600.0
    """How long the gateway waits for an upstream answer (and between streamed chunks) before
    the call fails as an infrastructure error (retried)."""
    durable_calls: bool = True
    """An answered call's record is durable before the answer's last byte is sent (a crash
    loses no answered call): appended to ``call_log`` if set, else committed to the store;
    ``False`` writes records in background batches (a crash loses the last ones)."""
    call_log: str | None = None
    """Directory of the gateway's local call log: with ``durable_calls``, an answer waits for
    one local ``write`` instead of a store commit (docs/online.md measures both); calls a
    crashed gateway left there go to the store when the next one starts."""

    @field_validator("upstreams", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str | Upstream) else value

    @field_validator("upstream_timeout_s")
    @classmethod
    def _finite_positive(cls, value: float) -> float:
        if not (0 < value < math.inf):
            raise ValueError(f"must be a positive number of seconds, got {value!r}")
        return value

    def thread(self, store: Store | str, capture: Mapping[str, Any]) -> GatewayThread:
        """The gateway on its own thread (what the trainer runs); ``capture`` is
        :meth:`CaptureOptions.gateway_options`."""
        return GatewayThread(store, self.upstreams, host=self.host, port=self.port, **self._options(capture))

    def gateway(self, store: Store, capture: Mapping[str, Any], **extra: Any) -> Gateway:
        """The gateway on the caller's event loop (what ``agentbolt gateway serve`` runs); start
        it with ``await gateway.start(options.host, options.port)``."""
        return Gateway(store, self.upstreams, **self._options(capture), **extra)

    def _options(self, capture: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "token": self.token,
            "request_timeout_s": self.upstream_timeout_s,
            "durable_calls": self.durable_calls,
            "call_log": self.call_log,
            **capture,
        }


class RunOptions(_Options):
    """What the run is recorded as in the store (``agentbolt runs list``, the dashboard)."""

    name: str | None = None
    """The run's name (default: the algorithm's)."""
    config: dict[str, Any] = Field(default_factory=dict)
    """More settings recorded with the run (JSON), beside the algorithm's: how the example names
    its held-out metric and what trivial policies score on it, which the run's summary card shows
    (:mod:`agentbolt.runs.summary`), e.g.
    ``{"heldout_metric": {"name": "accuracy", "threshold": 1.0}, "trivial": {"constant": 0.03}}``."""


class RunnerOptions(_Options):
    """How rollouts are run: how many runners, each doing how much at once, with which limits."""

    n: int = Field(default=1, ge=0)
    """Runner processes (or Ray workers); 0 runs one runner inside this process."""
    concurrency: int = Field(default=RunnerConfig.concurrency, ge=1)
    """Rollouts each runner runs at once."""
    max_attempts: int = Field(default=3, ge=1)
    """Attempts per rollout (retries are for infrastructure failures only)."""
    timeout_s: float | None = Field(default=None, gt=0)
    """Limit of one attempt (``None``: none)."""
    lease_s: float = Field(default=RunnerConfig.lease_s, gt=0)
    """Runner lease on an attempt; renewed every third of it."""
    restarts: int = Field(default=10, ge=0)
    """Runner processes that die are replaced this many times in all; when none is left the run
    fails with a message saying so."""
    kind: Literal["processes", "ray"] = "processes"
    """Runner processes on this machine, or Ray actors (:class:`~agentbolt.runners.ray.RayRunnerPool`;
    needs ``agentbolt[ray]``)."""
    ray_address: str | None = None
    """The Ray cluster for ``kind="ray"`` (``None``: a new local one)."""
    ray_options: RayWorkerOptions = Field(default_factory=RayWorkerOptions)
    """Per-worker placement for ``kind="ray"``: a :class:`~agentbolt.runners.ray.RayWorkerOptions`
    or its fields as a mapping."""

    @field_validator("ray_options", mode="before")
    @classmethod
    def _ray_options(cls, value: Any) -> RayWorkerOptions:
        return options_from_mapping(value)

    @model_validator(mode="after")
    def _ray_needs_workers(self) -> RunnerOptions:
        if self.kind == "ray" and self.n == 0:
            raise ValueError("kind='ray' needs n >= 1 (the number of Ray runner workers)")
        return self

    def config(self, capture: CaptureOptions | None = None, *, mode: t.RolloutMode | None = None) -> RunnerConfig:
        """Each runner's :class:`~agentbolt.runners.runner.RunnerConfig`."""
        adapters = capture.adapters if capture is not None else None
        return RunnerConfig(concurrency=self.concurrency, lease_s=self.lease_s, adapters=adapters, mode=mode)

    def pool(
        self,
        agent: AgentLike | str,
        store_url: str,
        config: RunnerConfig,
        *,
        gateway_host: str | None = None,
        store_token: str | None = None,
    ) -> RunnerPool | RayRunnerPool:
        """The ``n`` runners (``n >= 1``) as processes or Ray actors, not started yet."""
        if self.kind == "ray":
            return RayRunnerPool(
                agent,
                store_url,
                workers=self.n,
                config=config,
                address=self.ray_address,
                options=self.ray_options,
                gateway_host=gateway_host,
                store_token=store_token,
            )
        return RunnerPool(agent, store_url, processes=self.n, config=config, max_restarts=self.restarts)
