"""One config surface: agentbolt's keys, validated strictly, composed with verl's Hydra config.

A training config file has two top-level sections::

    agentbolt:                 # ours, validated here (unknown keys rejected)
      store_url: sqlite:///runs/agentbolt.db
      gateway: {url: http://10.0.0.5:8100/v1, control: mypkg.gateway:control}
      lightningrl:             # agentbolt.lightningrl.LightningRLConfig, field for field
        advantage: grpo
        advantage_options: {level: rollout}
        loss_aggregation: rollout-mean-token-mean
    verl:                      # verl's keys, passed through as Hydra overrides
      actor_rollout_ref.model.path: Qwen/Qwen2.5-0.5B-Instruct
      data.train_batch_size: 8
      actor_rollout_ref.rollout.n: 4

:func:`compose_verl_config` composes verl's own ``ppo_trainer.yaml`` (shipped in the verl
wheel) with Hydra's compose API, applying the verl keys our settings decide
(:func:`derived_overrides`: the advantage estimator and ``loss_agg_mode`` come from the
``lightningrl`` section), then the user's ``verl`` overrides; Hydra rejects unknown verl
keys, and overriding a key that our settings decide is an error naming the setting to use
instead. The result is verl's ``DictConfig`` with our settings under ``agentbolt``.
Composition does not import verl (it only reads its YAML), so it is cheap.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentbolt.errors import UserError
from agentbolt.lightningrl import LightningRLConfig

from ._verl import check_verl_version

__all__ = [
    "AGENT_LOOP_NAME",
    "TRAINER_MODE",
    "VERL_ESTIMATORS",
    "AgentboltSettings",
    "BatchSettings",
    "DataSettings",
    "GatewaySettings",
    "RolloutSettings",
    "RunnersSettings",
    "TrainConfig",
    "compose_verl_config",
    "derived_overrides",
    "format_override",
    "load_config",
    "settings_from_verl_config",
    "verl_config_dir",
]

TRAINER_MODE = "agentbolt_sync"
"""``trainer.v1.trainer_mode`` of the binding's trainer (registered with verl's ``register_trainer``)."""
AGENT_LOOP_NAME = "agentbolt"
"""Name of the binding's agent loop (``actor_rollout_ref.rollout.agent.default_agent_loop``)."""
WORKER_SETUP_HOOK = "agentbolt_verl.binding.worker_hooks.worker_setup"
"""Ray ``worker_process_setup_hook``: registers the trainer, estimators and loss in every Ray worker."""
EXTERNAL_LIB = "agentbolt_verl.registry"
"""``actor_rollout_ref.model.external_lib``: verl imports it in its workers (estimators, loss)."""


class _Strict(BaseModel):
    """Frozen; unknown keys are rejected with the list of valid ones."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    @model_validator(mode="before")
    @classmethod
    def _reject_unknown(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = sorted(str(k) for k in data if k not in cls.model_fields)
            if unknown:
                raise ValueError(
                    f"unknown key(s) {', '.join(repr(k) for k in unknown)}; valid keys: {', '.join(cls.model_fields)}"
                )
        return data


class GatewaySettings(_Strict):
    """How agents reach the policy, and how the trainer controls the gateway."""

    url: str | None = None
    """Base URL agents are given (``Resources.llm.base_url``), e.g. ``http://10.0.0.5:8100/v1``."""
    control: str | None = None
    """``module:callable`` returning a :class:`~agentbolt_verl.binding.gateway.GatewayControl`;
    called with ``url=`` (the gateway URL). Required to train."""
    model_name: str = "policy"
    """Model name agents send; the gateway maps it to the name vLLM serves."""
    drain_timeout_s: float = Field(default=120.0, gt=0)
    """How long in-flight calls may take to finish before the replicas sleep; then they are aborted."""


class RolloutSettings(_Strict):
    """How each verl session becomes an agentbolt rollout."""

    timeout_s: float | None = Field(default=900.0, gt=0)
    """Per-attempt limit, enforced by the store."""
    max_attempts: int = Field(default=3, ge=1, le=100)
    """Attempts allowed for infrastructure failures."""
    wait_timeout_s: float | None = Field(default=None, gt=0)
    """How long the agent loop waits for the rollout; default ``timeout_s * max_attempts + 60``."""
    on_failure: Literal["drop", "reward"] = "drop"
    """A failed or timed-out rollout: ``drop`` it, or train its calls with ``failure_reward``."""
    failure_reward: float = 0.0
    """Reward of a failed rollout's calls with ``on_failure="reward"``."""
    fill_reward_from_rollout: bool = True
    """A call without a reward takes the rollout's ``final_reward`` (counted)."""


class BatchSettings(_Strict):
    """Drop and truncation rules (see :class:`~agentbolt_verl.batch.BatchOptions`)."""

    max_prompt_length: int | None = Field(default=None, ge=1)
    """Default: ``actor_rollout_ref.rollout.prompt_length``."""
    max_response_length: int | None = Field(default=None, ge=1)
    """Default: ``actor_rollout_ref.rollout.response_length``."""
    overlong_prompt: Literal["drop", "truncate"] = "drop"
    """Prompt over the limit: drop the call, or keep its last tokens."""
    overlong_response: Literal["drop", "truncate"] = "truncate"
    """Response over the limit: drop the call, or keep its first tokens."""
    missing_reward: Literal["drop", "zero"] = "drop"
    """A call still without a reward: drop it, or give it 0."""
    retokenized: Literal["drop", "keep"] = "drop"
    """Calls whose ids were re-tokenized from text."""


class DataSettings(_Strict):
    """Tasks to train on (JSON Lines of :class:`agentbolt.types.Task`)."""

    train: str | None = None
    """Training tasks file."""
    val: str | None = None
    """Validation tasks file."""
    workdir: str = "agentbolt-verl"
    """Where the parquet files verl's dataloader reads are written."""


class RunnersSettings(_Strict):
    """agentbolt runners the binding starts itself, as Ray actors in verl's own Ray cluster,
    instead of a separately started runner fleet (``agentbolt runner ...``)."""

    ray: bool = False
    """Start the runners as Ray actors in verl's cluster (:class:`agentbolt.runners.ray.RayRunnerPool`)."""
    agent: str | None = None
    """The agent as ``module:attr`` (importable on every Ray node). Required with ``ray``."""
    workers: int = Field(default=1, ge=1)
    """Runner actors."""
    concurrency: int = Field(default=8, ge=1)
    """Rollouts each actor runs at once."""
    lease_s: float = Field(default=30.0, gt=0)
    """Runner lease; a dead actor's rollouts are handed out again this long after it died."""
    num_cpus: float = Field(default=1.0, ge=0)
    """CPUs Ray reserves per actor (verl's GPU workers are not touched: runners ask for no GPU)."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources per actor (e.g. ``{"sandbox": 1}``)."""
    max_restarts: int = Field(default=-1, ge=-1)
    """Ray restarts of a dead actor (``-1``: always)."""

    @model_validator(mode="after")
    def _agent_when_ray(self) -> RunnersSettings:
        if self.ray and not self.agent:
            raise ValueError("runners.ray=true needs runners.agent ('package.module:agent')")
        return self


class AgentboltSettings(_Strict):
    """The ``agentbolt`` section."""

    store_url: str
    """Store the runners and the binding share, e.g. ``sqlite:///runs/agentbolt.db``."""
    transitions: str = "agentbolt_verl.binding.rollouts:lightningrl_transitions"
    """``module:callable`` factory returning ``spans_to_transitions(rollouts, spans)``; called
    with ``lightningrl=`` (the :attr:`lightningrl` config) and ``**transitions_options``."""
    transitions_options: dict[str, Any] = Field(default_factory=dict)
    """More keyword options of a custom ``transitions`` factory (it is always called with
    ``lightningrl=`` the config below; the default factory takes nothing else)."""
    lightningrl: LightningRLConfig = Field(default_factory=LightningRLConfig)
    """Credit, advantage estimator and level, selective optimization (``agent_match``) and loss
    aggregation: :class:`agentbolt.lightningrl.LightningRLConfig`'s fields. verl's
    ``algorithm.adv_estimator``, ``norm_adv_by_std_in_grpo``, ``policy_loss.loss_mode`` and
    ``loss_agg_mode`` are derived from it (:func:`derived_overrides`)."""
    singleton_groups: Literal["zero", "raw"] = "zero"
    """verl only: a rollout alone in its group gets advantage 0 (as LightningRL's estimators
    give it), or its raw reward (verl's behaviour)."""
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    """The gateway."""
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    """Rollouts."""
    batch: BatchSettings = Field(default_factory=BatchSettings)
    """Drop and truncation rules."""
    data: DataSettings = Field(default_factory=DataSettings)
    """Task files."""
    runners: RunnersSettings = Field(default_factory=RunnersSettings)
    """Runners the binding starts in verl's Ray cluster (off by default: runners run apart)."""

    @model_validator(mode="after")
    def _consistent(self) -> AgentboltSettings:
        verl_advantage(self.lightningrl)  # raises on what verl cannot run
        return self


class TrainConfig(_Strict):
    """A training config file: our settings plus verl overrides."""

    agentbolt: AgentboltSettings
    """agentbolt's settings."""
    verl: dict[str, Any] | list[str] = Field(default_factory=dict)
    """verl keys as a (possibly nested) mapping of dotted keys, or Hydra override strings."""


def load_config(source: TrainConfig | Mapping[str, Any] | str | os.PathLike[str]) -> TrainConfig:
    """Validate a config given as a model, a mapping, or a YAML/JSON file path."""
    if isinstance(source, TrainConfig):
        return source
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        if not path.is_file():
            raise UserError(f"config file {str(path)!r} does not exist")
        text = path.read_text()
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            from omegaconf import OmegaConf
            from omegaconf.errors import OmegaConfBaseException

            node = OmegaConf.create(text)
            if not isinstance(node, Mapping):
                raise UserError(f"config file {str(path)!r} must hold a mapping with 'agentbolt' and 'verl'")
            try:
                # the agentbolt section may use ${oc.env:VAR,default}; verl's keys are left as
                # written (they may refer to verl's own config)
                data = {
                    str(k): OmegaConf.to_container(v, resolve=k == "agentbolt") if OmegaConf.is_config(v) else v
                    for k, v in node.items_ex(resolve=False)
                }
            except OmegaConfBaseException as exc:
                raise UserError(f"config file {str(path)!r}: {exc}") from None
        if not isinstance(data, Mapping):
            raise UserError(f"config file {str(path)!r} must hold a mapping with 'agentbolt' and 'verl'")
        source = data
    try:
        return TrainConfig.model_validate(source)
    except ValidationError as exc:
        raise UserError(_describe(exc)) from None


def _describe(exc: ValidationError) -> str:
    lines = ["invalid agentbolt-verl config:"]
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"  {where}: {msg}")
    return "\n".join(lines)


def verl_config_dir() -> Path:
    """verl's ``trainer/config`` folder (found without importing verl)."""
    check_verl_version()
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("verl is installed but its package folder cannot be found")
    path = Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"
    if not (path / "ppo_trainer.yaml").is_file():
        raise UserError(f"verl's ppo_trainer.yaml is missing under {path}")
    return path


def agent_loop_config_path() -> Path:
    """The YAML file that registers the binding's agent loop with verl."""
    return Path(__file__).parent / "binding" / "agent_loops.yaml"


VERL_ESTIMATORS = {"grpo": "grpo", "rloo": "rloo", "reinforce_pp": "reinforce_plus_plus_baseline"}
"""LightningRL estimator name → the verl estimator that computes it in verl's driver."""
_VERL_ADVANTAGE_OPTIONS = ("level", "norm_std")


def verl_advantage(lrl: LightningRLConfig) -> tuple[str, str, bool]:
    """(verl estimator, level, norm_std) for a LightningRL config, or a :class:`ValueError`
    saying what verl cannot run (the message names the ``lightningrl`` fields)."""
    if not isinstance(lrl.advantage, str) or lrl.advantage not in VERL_ESTIMATORS:
        raise ValueError(
            f"lightningrl.advantage={lrl.advantage!r} has no verl estimator; valid: {', '.join(VERL_ESTIMATORS)}"
        )
    unknown = sorted(set(lrl.advantage_options) - set(_VERL_ADVANTAGE_OPTIONS))
    if unknown:
        raise ValueError(
            f"lightningrl.advantage_options {', '.join(unknown)} cannot be passed to verl; valid: "
            + ", ".join(_VERL_ADVANTAGE_OPTIONS)
        )
    level = lrl.advantage_options.get("level", "rollout")
    norm_std = lrl.advantage_options.get("norm_std", True)
    if level not in ("rollout", "transition"):
        raise ValueError(f"lightningrl.advantage_options.level must be 'rollout' or 'transition', got {level!r}")
    if not isinstance(norm_std, bool):
        raise ValueError(f"lightningrl.advantage_options.norm_std must be true or false, got {norm_std!r}")
    if "norm_std" in lrl.advantage_options and lrl.advantage != "grpo":
        raise ValueError("lightningrl.advantage_options.norm_std applies to advantage 'grpo' only")
    if lrl.loss_aggregation == "rollout-mean-token-mean" and level != "rollout":
        raise ValueError(
            "lightningrl.loss_aggregation='rollout-mean-token-mean' needs advantage_options.level='rollout' (the "
            "per-rollout weights are folded into the advantages by the rollout-level estimator)"
        )
    if level == "transition" and not norm_std and lrl.advantage == "grpo":
        raise ValueError(
            "lightningrl.advantage_options.norm_std=false (Dr.GRPO) with level='transition' is not honoured by "
            "verl's per-row GRPO (grpo_vectorized ignores algorithm.norm_adv_by_std_in_grpo); use level='rollout'"
        )
    return VERL_ESTIMATORS[lrl.advantage], level, norm_std


def derived_overrides(settings: AgentboltSettings) -> dict[str, Any]:
    """The verl keys our settings decide. Overriding them through ``verl`` is an error.

    From ``settings.lightningrl``: the estimator (rollout level: ours, registered in verl;
    transition level: verl's own per-row one) and the loss: ``rollout-mean-token-mean`` runs as
    :data:`agentbolt_verl.losses.LOSS_MODE` (weights in the advantages; ``loss_agg_mode``
    ``token-mean`` for the entropy and KL terms), verl's own modes pass through as ``loss_agg_mode``.
    """
    estimator, level, norm_std = verl_advantage(settings.lightningrl)
    if level == "rollout":
        estimator = f"agentbolt_rollout_{estimator}"
    elif estimator == "grpo":
        # verl V1 treats "grpo" per session already (compute_advantage_for_multi_trajectories);
        # "grpo_vectorized" is the same estimator through the per-row path
        estimator = "grpo_vectorized"
    aggregation = settings.lightningrl.loss_aggregation
    per_rollout = aggregation == "rollout-mean-token-mean"
    return {
        "algorithm.adv_estimator": estimator,
        "algorithm.norm_adv_by_std_in_grpo": norm_std,
        "actor_rollout_ref.actor.policy_loss.loss_mode": "agentbolt_rollout_mean" if per_rollout else "vanilla",
        "actor_rollout_ref.actor.loss_agg_mode": "token-mean" if per_rollout else aggregation,
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.agent.default_agent_loop": AGENT_LOOP_NAME,
        "actor_rollout_ref.rollout.agent.agent_loop_config_path": str(agent_loop_config_path()),
        "actor_rollout_ref.model.external_lib": EXTERNAL_LIB,
        "trainer.use_v1": True,
        "trainer.v1.trainer_mode": TRAINER_MODE,
        "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook": WORKER_SETUP_HOOK,
    }


def format_override(key: str, value: Any) -> str:
    """A Hydra override string ``key=value`` with ``value`` in Hydra's grammar."""
    return f"{key}={_hydra_value(value)}"


def _hydra_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise UserError(f"cannot pass {value!r} to verl")
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace("'", "\\'")
        return f"'{escaped}'"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{_hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, Sequence):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    raise UserError(f"cannot pass a {type(value).__name__} to verl as an override")


def _flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        full = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(_flatten(value, f"{full}."))
        else:
            out[full] = value
    return out


def _override_key(override: str) -> str:
    key = override.split("=", 1)[0].strip()
    return key.lstrip("+~")


def user_overrides(verl: Mapping[str, Any] | Sequence[str]) -> list[str]:
    """The ``verl`` section as Hydra override strings."""
    if isinstance(verl, Mapping):
        return [format_override(k, v) for k, v in _flatten(verl).items()]
    out = []
    for item in verl:
        if not isinstance(item, str) or "=" not in item:
            raise UserError(f"verl overrides given as a list must be 'key=value' strings, got {item!r}")
        out.append(item)
    return out


def compose_verl_config(config: TrainConfig | Mapping[str, Any] | str | os.PathLike[str], *, extra: Sequence[str] = ()):
    """verl's composed ``DictConfig`` for a training config (see the module docstring).

    ``extra`` are more Hydra override strings (e.g. from the command line), applied last.
    Raises :class:`~agentbolt.errors.UserError` on unknown verl keys, on overrides of keys our
    settings decide, and on invalid values.
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    cfg_model = load_config(config)
    settings = cfg_model.agentbolt
    derived = derived_overrides(settings)
    derived_keys = {k.lstrip("+") for k in derived}
    users = [*user_overrides(cfg_model.verl), *extra]
    clashes = sorted({_override_key(o) for o in users} & derived_keys)
    if clashes:
        raise UserError(
            f"verl key(s) {', '.join(clashes)} are set by agentbolt's settings (lightningrl, and the "
            "binding's trainer, agent loop and registries); change the agentbolt section instead"
        )
    overrides = [format_override(k, v) for k, v in derived.items()] + users
    try:
        with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
            cfg = compose(config_name="ppo_trainer", overrides=overrides)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        hint = _unknown_key_hint([format_override(k, v) for k, v in derived.items()], users)
        raise UserError(f"verl rejected the overrides: {exc}{hint}") from None
    try:
        prompt_length = int(OmegaConf.select(cfg, "actor_rollout_ref.rollout.prompt_length"))
        response_length = int(OmegaConf.select(cfg, "actor_rollout_ref.rollout.response_length"))
    except (OmegaConfBaseException, TypeError, ValueError) as exc:
        raise UserError(f"cannot resolve the rollout prompt/response lengths: {exc}") from None
    batch = settings.batch.model_copy(
        update={
            "max_prompt_length": settings.batch.max_prompt_length or prompt_length,
            "max_response_length": settings.batch.max_response_length or response_length,
        }
    )
    if batch.max_response_length > response_length:
        raise UserError(
            f"agentbolt.batch.max_response_length ({batch.max_response_length}) exceeds "
            f"actor_rollout_ref.rollout.response_length ({response_length})"
        )
    resolved = settings.model_copy(update={"batch": batch})
    with open_dict(cfg):
        cfg.agentbolt = OmegaConf.create(resolved.model_dump(mode="json"))
    return cfg


def _unknown_key_hint(base_overrides: list[str], users: Sequence[str]) -> str:
    """For the first user key verl does not have: the valid keys of its deepest known parent."""
    from hydra import compose, initialize_config_dir
    from omegaconf import DictConfig, OmegaConf

    try:
        with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
            base = compose(config_name="ppo_trainer", overrides=base_overrides)
    except Exception:  # the hint is best effort; the original error is raised anyway
        return ""
    missing = object()
    for override in users:
        raw_key = override.split("=", 1)[0].strip()
        if raw_key.startswith(("+", "~")):
            continue
        parts = raw_key.split(".")
        if OmegaConf.select(base, raw_key, default=missing) is not missing:
            continue
        for depth in range(len(parts) - 1, -1, -1):
            parent = OmegaConf.select(base, ".".join(parts[:depth])) if depth else base
            if isinstance(parent, DictConfig):
                keys = sorted(str(k) for k in parent if not str(k).startswith("_"))
                where = ".".join(parts[:depth]) or "the top level"
                shown = ", ".join(keys[:60]) + (", ..." if len(keys) > 60 else "")
                return f"\nverl has no key {raw_key!r}; valid keys under {where}: {shown}"
    return ""


def settings_from_verl_config(cfg: Any) -> AgentboltSettings:
    """Our settings back from a composed verl config (as the binding reads them in workers)."""
    from omegaconf import OmegaConf

    section = cfg.get("agentbolt") if hasattr(cfg, "get") else None
    if section is None:
        raise UserError(
            "the verl config has no 'agentbolt' section: compose it with agentbolt_verl.config.compose_verl_config"
        )
    data = OmegaConf.to_container(section, resolve=True) if OmegaConf.is_config(section) else section
    try:
        return AgentboltSettings.model_validate(data)
    except ValidationError as exc:
        raise UserError(_describe(exc)) from None
