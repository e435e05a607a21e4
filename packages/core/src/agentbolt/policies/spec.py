"""Policies by role: which trained weights serve (and learn from) which agent's calls, declared once.

A *policy* is one named set of trained weights; with agentbolt-torch, a LoRA adapter on a shared
base model. Every LLM call already carries its agent's name (the gateway's ``X-Agentbolt-Agent-Name``
header or ``agent_names`` rules, a framework adapter's agent span); :class:`Policies` maps
those names to policies::

    from agentbolt.policies import Policies, match

    Trainer(
        agent,
        "torch-grpo",
        policies={"writer": match("write_query", rank=16), "rewriter": match("rewrite_query", lr=5e-5)},
    )

- **Serving.** The gateway routes each call to its agent's policy by asking the upstream for the
  policy's name as the model (vLLM serves a LoRA adapter by its name the same way); a call whose
  agent no policy matches goes to the base model. The upstream answers with the policy and its
  version, and the gateway records both on the call's span.
- **Training.** LightningRL runs once per policy (each may have its own
  :class:`~agentbolt.lightningrl.LightningRLConfig`); a call trains only its own policy, and only
  if it was served by it. Calls of agents no policy matches are left out with the reason
  ``no_policy``; calls served by another policy than their agent's (the gateway could not name
  the agent when the call was made) with ``policy_mismatch``.
- **The default**, ``policies=None``, is one shared policy for every agent: what happens without
  this module (no routing, one set of weights, LightningRL's ``agent_match`` selects the trained
  agents).

The first policy whose ``match`` accepts an agent name is that agent's (declaration order, like
``agent_names`` rules). The command line builds the same object from ``NAME=MATCH`` strings
(``agentbolt gateway serve --policy writer=write_query``; :meth:`Policies.from_specs`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from ..errors import UserError, invalid_fields_message
from ..lightningrl.config import LightningRLConfig
from ..lightningrl.episode import agent_selector

__all__ = ["BASE_POLICY", "SHARED_POLICY", "Policies", "PolicySpec", "match"]

SHARED_POLICY = "policy"
"""Name of the one policy of :meth:`Policies.shared` (the default)."""
BASE_POLICY = "__base__"
"""What serves a call no policy matches: the base model (no adapter). Not a valid policy name."""

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")


class PolicySpec(BaseModel):
    """One policy: which agents it serves and how it is trained (unset fields: the algorithm's)."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True, use_attribute_docstrings=True)

    match: Any = None
    """Its agents, with ``agent_match``'s semantics: ``None`` (every agent), a regex searched in the
    name, a collection of exact names, or a predicate. :func:`match` builds exact names."""
    rank: int | None = Field(default=None, ge=1)
    """LoRA rank of its adapter (``None``: the algorithm's)."""
    alpha: int | None = Field(default=None, gt=0)
    """LoRA scaling numerator (``None``: twice the rank)."""
    lr: float | None = Field(default=None, gt=0)
    """Learning rate of its optimizer (``None``: the algorithm's)."""
    lightningrl: LightningRLConfig | None = None
    """Its own transitions → loss choices (credit, advantage, ...; ``None``: the algorithm's).
    Its ``agent_match`` applies on top of ``match``."""
    init_from: str | None = None
    """Start its adapter from these weights: a checkpoint of this policy
    (``checkpoint-N/policies/<name>``), a single-policy LoRA checkpoint, or a LoRA adapter folder."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Backend-specific settings (agentbolt-torch: any other ``peft.LoraConfig`` argument, e.g.
    ``target_modules``)."""
    _selector: Callable[[str | None], bool] = PrivateAttr()

    def __init__(self, **fields: Any) -> None:
        try:
            super().__init__(**fields)
        except ValidationError as exc:
            unknown = f"unknown setting; valid: {', '.join(type(self).model_fields)}"
            raise UserError(invalid_fields_message("invalid policy", exc, unknown=unknown)) from None

    def model_post_init(self, context: Any, /) -> None:
        self._selector = agent_selector(self.match)

    @field_validator("match")
    @classmethod
    def _valid_match(cls, value: Any) -> Any:
        agent_selector(value)  # raises UserError on an invalid regex or type
        if isinstance(value, list | set | frozenset):
            return tuple(sorted(value)) if isinstance(value, set | frozenset) else tuple(value)
        return value

    @field_validator("lightningrl", mode="before")
    @classmethod
    def _config(cls, value: Any) -> Any:
        return None if value is None else LightningRLConfig.from_value(value)

    def selects(self, agent_name: str | None) -> bool:
        """True when this policy's ``match`` accepts ``agent_name``."""
        return self._selector(agent_name)

    def as_record(self) -> dict[str, Any]:
        """JSON-compatible fields, as runs record them (patterns and predicates as their ``repr``)."""
        out: dict[str, Any] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, LightningRLConfig):
                value = value.as_record()
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, re.Pattern):
                value = f"re:{value.pattern}"
            elif callable(value):
                value = repr(value)
            out[name] = value
        return out


def match(*agents: str | re.Pattern[str] | Callable[[str | None], bool], **settings: Any) -> PolicySpec:
    """A :class:`PolicySpec` for these agents: exact names (``match("write_query")`` does not
    select ``rewrite_query``), one compiled regex searched in the name, or one predicate;
    ``settings`` are its other fields (``rank``, ``alpha``, ``lr``, ``lightningrl``, ``init_from``,
    ``options``). ``match()`` with no agent selects every agent."""
    if not agents:
        selector: Any = None
    elif all(isinstance(a, str) for a in agents):
        selector = tuple(agents)
    elif len(agents) == 1:
        selector = agents[0]
    else:
        raise UserError("match() takes agent names, or one re.compile(...) pattern, or one predicate")
    return PolicySpec(match=selector, **settings)


class Policies(Mapping[str, PolicySpec]):
    """The policies of a run, by name, in declaration order (see the module doc).

    Args:
        policies: policy name -> :class:`PolicySpec` (or a mapping of its fields); names are
            letters, digits, ``_`` and ``-`` (they become adapter and model names).
    """

    def __init__(self, policies: Mapping[str, PolicySpec | Mapping[str, Any]]) -> None:
        if not isinstance(policies, Mapping) or not policies:
            raise UserError("policies takes a non-empty mapping of policy name -> match(...)")
        specs: dict[str, PolicySpec] = {}
        for name, spec in policies.items():
            if not isinstance(name, str) or not _NAME.match(name) or name == BASE_POLICY:
                raise UserError(
                    f"policy name {name!r}: use letters, digits, '_' and '-' (at most 64, not starting with a "
                    f"digit or '-'; {BASE_POLICY!r} is reserved); it names the adapter and the served model"
                )
            if isinstance(spec, Mapping):
                spec = PolicySpec(**spec)
            if not isinstance(spec, PolicySpec):
                raise UserError(f"policy {name!r}: expected match(...) or a PolicySpec, got {type(spec).__name__}")
            specs[name] = spec
        names = list(specs)
        for i, name in enumerate(names[:-1]):
            if specs[name].match is None:
                raise UserError(
                    f"policy {name!r} matches every agent, so {', '.join(map(repr, names[i + 1 :]))} would never "
                    "serve a call: declare it last"
                )
        self._specs = specs

    # -- building ---------------------------------------------------------------------------------

    @classmethod
    def shared(cls) -> Policies:
        """One policy (:data:`SHARED_POLICY`) for every agent: the default."""
        return cls({SHARED_POLICY: PolicySpec()})

    @classmethod
    def from_value(cls, value: Policies | Mapping[str, Any] | None) -> Policies:
        """``Trainer(policies=...)``'s value: ``None`` (:meth:`shared`), a :class:`Policies`, or a
        mapping of name -> :class:`PolicySpec` / its fields."""
        if value is None:
            return cls.shared()
        if isinstance(value, Policies):
            return value
        if isinstance(value, Mapping):
            return cls(value)
        raise UserError(
            f"policies takes a mapping of policy name -> match(...) (or Policies, or None), got {type(value).__name__}"
        )

    @classmethod
    def from_specs(cls, specs: Sequence[str]) -> Policies | None:
        """Policies from the command line's ``NAME=AGENT[,AGENT...]`` (exact agent names) or
        ``NAME=re:PATTERN`` (a regex searched) strings; ``None`` for no spec."""
        policies: dict[str, PolicySpec] = {}
        for spec in specs:
            name, sep, text = spec.partition("=")
            if not sep or not name or not text:
                raise UserError(f"a policy is NAME=AGENT[,AGENT...] or NAME=re:PATTERN, got {spec!r}")
            if name in policies:
                raise UserError(f"policy {name!r} is given twice")
            if text.startswith("re:"):
                try:
                    policies[name] = match(re.compile(text[3:]))
                except re.error as exc:
                    raise UserError(f"policy {name!r}: {text[3:]!r} is not a regular expression: {exc}") from None
            else:
                policies[name] = match(*[a for a in text.split(",") if a])
        return cls(policies) if policies else None

    # -- reading ----------------------------------------------------------------------------------

    def __getitem__(self, name: str) -> PolicySpec:
        try:
            return self._specs[name]
        except KeyError:
            raise UserError(f"no policy {name!r}; the policies are {', '.join(self._specs)}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def __repr__(self) -> str:
        return f"Policies({', '.join(f'{n}={s.match!r}' for n, s in self._specs.items())})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Policies) and self._specs == other._specs

    __hash__ = None  # type: ignore[assignment]

    @property
    def names(self) -> tuple[str, ...]:
        """Policy names in declaration order."""
        return tuple(self._specs)

    @property
    def is_shared(self) -> bool:
        """True for one policy that serves every agent: no routing, today's single set of weights."""
        return len(self._specs) == 1 and next(iter(self._specs.values())).match is None

    def policy_for(self, agent_name: str | None) -> str | None:
        """The policy of an agent: the first whose ``match`` accepts the name; ``None`` when none
        does (the call is served by the base model and not trained)."""
        for name, spec in self._specs.items():
            if spec.selects(agent_name):
                return name
        return None

    def router(self) -> Callable[[str | None], str | None] | None:
        """What the gateway routes with (agent name -> policy name, ``None`` for the base model),
        or ``None`` for a shared policy (nothing to route)."""
        return None if self.is_shared else self.policy_for

    def agents_of(self, names: Iterable[str | None]) -> dict[str | None, str | None]:
        """Agent name -> its policy, for each of ``names``."""
        return {name: self.policy_for(name) for name in names}

    def as_record(self) -> dict[str, Any]:
        """The policies as JSON-compatible values (what runs record)."""
        return {name: spec.as_record() for name, spec in self._specs.items()}
