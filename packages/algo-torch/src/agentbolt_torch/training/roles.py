"""Policies by role in agentbolt-torch: one base model, one LoRA adapter and one optimizer per policy.

``Trainer(agent, "torch-grpo", policies={"writer": match("write_query"), "rewriter": match("rewrite_query")})``
makes ``torch-grpo`` build, through :func:`load_role_policies`:

- one :class:`~agentbolt_torch.policy.Policy` holding the base model and an adapter per policy
  (:mod:`agentbolt_torch.adapters`; each with the policy's rank), served by one engine and one
  policy server, which picks the adapter of each call from its ``model`` (the gateway asks for
  the policy of the call's agent);
- a :class:`RoleUpdater`: one :class:`~agentbolt_torch.update.updater.PolicyUpdater` per adapter, each
  with its own optimizer and scheduler, learning rate (``PolicySpec.lr``) and loss settings;
- core's :class:`~agentbolt.policies.PolicyLightningRL`: each policy's rows from its own agents'
  calls, with its own LightningRL config.

A step updates the adapters whose policies have rows, one after the other, while generation is
paused; an adapter without rows keeps its weights, optimizer state and version. Checkpoints hold
one sub-checkpoint per policy (``policies/<name>/``, the single-policy layout with ``adapter/``),
so each adapter can start another run (``PolicySpec.init_from``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentbolt.errors import UserError
from agentbolt.lightningrl import LightningRLConfig, TrainingRow
from agentbolt.policies import Policies, PolicyBatch, PolicyLightningRL, PolicySpec
from agentbolt.types import Transition

from ..adapters import adapter_file, load_adapter_weights
from ..policy import LoraSettings, Policy
from ..update.checkpoint import install_directory
from ..update.updater import PolicyUpdater, UpdateConfig, UpdateMetrics

__all__ = ["RoleLightningRL", "RoleUpdateMetrics", "RoleUpdater", "load_role_policies", "lora_settings_for"]

logger = logging.getLogger(__name__)

CHECKPOINT_KIND = "policies"
"""``state.json`` ``kind`` of a per-role checkpoint."""


@dataclass
class RoleUpdateMetrics:
    """What one :meth:`RoleUpdater.update` did, per policy."""

    per_policy: dict[str, UpdateMetrics]
    """The update of each policy that had rows."""
    seconds: float
    """Wall time of all the updates."""
    idle: list[str] = field(default_factory=list)
    """Policies without rows this step (weights, optimizer state and version unchanged)."""

    def as_dict(self) -> dict[str, float]:
        """``<policy>/<metric>`` for each updated policy (``step`` left out)."""
        return {
            f"{name}/{key}": float(value)
            for name, metrics in self.per_policy.items()
            for key, value in metrics.as_dict().items()
            if key != "step"
        }


class RoleUpdater:
    """One :class:`~agentbolt_torch.update.updater.PolicyUpdater` per adapter of ``policy``.

    Args:
        policy: a policy with one adapter per policy name.
        policies: the run's policies (which agent's rows train which adapter).
        updaters: policy name -> its updater (``adapter=`` that name).
    """

    def __init__(self, policy: Policy, policies: Policies, updaters: Mapping[str, PolicyUpdater]) -> None:
        if set(updaters) != set(policies) or set(policy.adapters) != set(policies):
            raise UserError(
                f"one updater and one adapter per policy: policies {list(policies)}, adapters "
                f"{list(policy.adapters)}, updaters {list(updaters)}"
            )
        self.policy = policy
        self.policies = policies
        self.updaters = dict(updaters)

    @property
    def step(self) -> int:
        """Updates of the most updated policy."""
        return max(u.step for u in self.updaters.values())

    def split(self, rows: Sequence[TrainingRow] | Sequence[Transition]) -> dict[str, list[Any]]:
        """``rows`` by the policy of their agent (every policy, possibly with none)."""
        out: dict[str, list[Any]] = {name: [] for name in self.policies}
        for row in rows:
            name = self.policies.policy_for(row.agent_name)
            if name is None:
                raise UserError(
                    f"a row of agent {row.agent_name!r} belongs to no policy; PolicyLightningRL leaves such calls out "
                    "(no_policy): build the rows with it"
                )
            out[name].append(row)
        return out

    def update(self, rows: Sequence[TrainingRow] | Sequence[Transition]) -> RoleUpdateMetrics:
        """Update each policy's adapter on its rows (see :meth:`PolicyUpdater.update`)."""
        started = time.perf_counter()
        per_policy: dict[str, UpdateMetrics] = {}
        idle = []
        for name, own in self.split(rows).items():
            if own:
                per_policy[name] = self.updaters[name].update(own)
            else:
                idle.append(name)
        return RoleUpdateMetrics(per_policy=per_policy, seconds=time.perf_counter() - started, idle=idle)

    # -- checkpoints -----------------------------------------------------------------------------

    def save_checkpoint(self, path: str | os.PathLike[str]) -> Path:
        """Write ``path/policies/<name>/`` (each policy's adapter, optimizer, RNG and state, the
        single-policy layout) and ``path/state.json``, atomically (replacing a checkpoint at ``path``)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
        try:
            for name, updater in self.updaters.items():
                updater.save_checkpoint(tmp / "policies" / name)
            state = {
                "kind": CHECKPOINT_KIND,
                "policies": list(self.updaters),
                "policy_version": self.policy.version,
                "versions": {name: self.policy.version_of(name) for name in self.updaters},
                "saved_at": time.time(),
            }
            (tmp / "state.json").write_text(json.dumps(state, indent=2))
            install_directory(tmp, path)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        logger.info("checkpoint of policies %s saved to %s", ", ".join(self.updaters), path)
        return path

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Restore every policy from a checkpoint written by :meth:`save_checkpoint` (the same policies)."""
        path = Path(path)
        state = _read_state(path)
        if state.get("kind") != CHECKPOINT_KIND:
            raise UserError(
                f"{path} is a single-policy checkpoint; resume= takes a checkpoint of the same policies "
                "(start an adapter from it with PolicySpec.init_from instead)"
            )
        saved = list(state.get("policies") or [])
        if set(saved) != set(self.updaters):
            raise UserError(f"{path} holds policies {saved}, this run has {list(self.updaters)}")
        for name, updater in self.updaters.items():
            updater.load_checkpoint(path / "policies" / name)
        self.policy.set_version(int(state.get("policy_version", 0)))

    def init_from(self) -> None:
        """Load each policy's ``init_from`` weights into its adapter (nothing else: a fresh start)."""
        from safetensors.torch import load_file

        for name, spec in self.policies.items():
            if spec.init_from is None:
                continue
            file = adapter_file(spec.init_from)
            with self.policy.lock:
                load_adapter_weights(self.policy.model, name, load_file(str(file)), source=f"in {file}")
                self.policy.mark_weights_changed()
            logger.info("policy %s starts from %s", name, file)


class RoleLightningRL:
    """:class:`~agentbolt.policies.PolicyLightningRL` measuring each policy's staleness from its
    adapter's current version (what ``torch-grpo`` calls like a :class:`~agentbolt.lightningrl.LightningRL`)."""

    def __init__(self, lightningrl: PolicyLightningRL, policy: Policy) -> None:
        self.lightningrl = lightningrl
        self.policy = policy

    def process(
        self,
        rollouts: Sequence[Any],
        spans: Mapping[str, Sequence[Any]] | Sequence[Any],
        *,
        policy_version: int | None = None,
    ) -> PolicyBatch:
        """Each policy's rows (``policy_version``, the run's overall version, is not used: each
        policy's bound is measured from its own adapter's version)."""
        versions = {name: self.policy.version_of(name) for name in self.policy.adapters}
        return self.lightningrl.process(rollouts, spans, policy_versions=versions)


def _read_state(path: Path) -> dict[str, Any]:
    state_file = path / "state.json"
    if not state_file.is_file():
        raise UserError(f"{path} is not an agentbolt-torch checkpoint (no state.json)")
    return json.loads(state_file.read_text())


def lora_settings_for(spec: PolicySpec, base: LoraSettings | None) -> LoraSettings:
    """A policy's adapter settings: its ``rank`` / ``alpha`` / ``options`` over ``base`` (the
    algorithm's ``lora``, else :class:`~agentbolt_torch.policy.LoraSettings`'s defaults). A rank
    without an alpha gets alpha = 2 x rank."""
    base = base or LoraSettings()
    options = dict(spec.options)
    known = {f.name for f in dataclasses.fields(LoraSettings)} - {"r", "alpha", "extra"}
    direct = {k: options.pop(k) for k in list(options) if k in known}
    if "target_modules" in direct:
        direct["target_modules"] = tuple(direct["target_modules"])
    rank = spec.rank or base.r
    alpha = spec.alpha if spec.alpha is not None else (2 * spec.rank if spec.rank else base.alpha)
    return dataclasses.replace(base, r=rank, alpha=alpha, extra={**base.extra, **options}, **direct)


def load_role_policies(
    model: str,
    policies: Policies,
    *,
    lora: LoraSettings | None,
    update: UpdateConfig,
    lightningrl: LightningRLConfig,
    autocast: Any,
    device: str,
    seed: int,
) -> tuple[Policy, RoleUpdater, PolicyLightningRL]:
    """The base model with one adapter per policy, its updaters and the per-policy LightningRL."""
    adapters = {name: lora_settings_for(spec, lora) for name, spec in policies.items()}
    policy = Policy.load(model, adapters=adapters, autocast_dtype=autocast, device=device, seed=seed)
    lrl = PolicyLightningRL(policies, lightningrl)
    updaters = {}
    for name, spec in policies.items():
        config = update if spec.lr is None else dataclasses.replace(update, lr=spec.lr)
        own = lrl.config_of(name)
        updaters[name] = PolicyUpdater(
            policy, config, loss_aggregation=own.loss_aggregation, correction=own.correction, adapter=name
        )
    role_updater = RoleUpdater(policy, policies, updaters)
    role_updater.init_from()
    logger.info(
        "policies by role on %s: %s",
        policy.name,
        ", ".join(f"{n} (rank {adapters[n].r}, {updaters[n].trainable_parameters:,} parameters)" for n in policies),
    )
    return policy, role_updater, lrl
