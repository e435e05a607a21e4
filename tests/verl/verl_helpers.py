"""Builders shared by the agentbolt-verl tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentbolt.types import TokenSource, Transition


def tr(
    rollout_id: str = "r1",
    index: int = 0,
    prompt: Sequence[int] = (11, 12, 13),
    response: Sequence[int] = (21, 22),
    *,
    reward: float | None = 1.0,
    group: str | None = "g1",
    logprobs: Sequence[float] | str | None = "auto",
    mask: Sequence[int] | None = None,
    advantage: float | None = None,
    source: TokenSource = TokenSource.EXACT,
    **kw: Any,
) -> Transition:
    """A transition; log-probs default to -0.1, -0.2, ... per response token."""
    if logprobs == "auto":
        logprobs = [-0.1 * (k + 1) for k in range(len(response))]
    return Transition(
        rollout_id=rollout_id,
        group_id=group,
        index=index,
        prompt_ids=list(prompt),
        response_ids=list(response),
        response_logprobs=None if logprobs is None else list(logprobs),  # type: ignore[arg-type]
        response_mask=None if mask is None else list(mask),
        reward=reward,
        advantage=advantage,
        token_source=source,
        **kw,
    )


# -- binding fakes ---------------------------------------------------------------------------


class FakeGateway:
    """A GatewayControl that records calls (into a shared log, when given)."""

    def __init__(self, log: list[str] | None = None, drains: bool = True, url: str | None = None) -> None:
        self.log = log if log is not None else []
        self.drains = drains
        self.url = url
        self.upstreams: list[str] = []
        self.paused = False
        self.policy_version: int | None = None

    async def set_upstreams(self, urls):
        self.upstreams = list(urls)
        self.log.append("set_upstreams")

    async def pause(self):
        self.paused = True
        self.log.append("pause")

    async def resume(self):
        self.paused = False
        self.log.append("resume")

    async def drain(self, timeout=None):
        self.log.append("drain")
        return self.drains

    async def set_policy(self, *, version=None, sampling=None, model=None):
        self.policy_version = version
        self.log.append("set_policy")


GATEWAYS: list[FakeGateway] = []
LOG: list[str] = []
"""Shared call log of the fake gateway and the fake verl trainer."""


def make_fake_gateway(url=None) -> FakeGateway:
    """Factory named by ``agentbolt.gateway.control`` in tests (logs into :data:`LOG`)."""
    gateway = FakeGateway(LOG, url=url)
    GATEWAYS.append(gateway)
    return gateway
