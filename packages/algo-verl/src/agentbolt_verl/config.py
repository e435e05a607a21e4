"""One config surface: agentbolt's keys, validated strictly, composed with verl's Hydra config.

A training config file has two top-level sections::

    agentbolt:                 # ours, validated here (unknown keys rejected)
      store_url: sqlite:///runs/agentbolt.db
      gateway: {url: http://10.0.0.5:8100/v1, control: mypkg.gateway:control}
      lightningrl:             # agentbolt.lightningrl.LightningRLConfig, field for field
        credit: final
        advantage: grpo
        max_staleness: 1
        rollout_is: token
      async: true              # verl's V1 colocate_async trainer (partial rollouts)
    verl:                      # verl's keys, passed through as Hydra overrides
      actor_rollout_ref.model.path: Qwen/Qwen2.5-0.5B-Instruct
      data.train_batch_size: 8
      actor_rollout_ref.rollout.n: 4

:func:`compose_verl_config` composes verl's own ``ppo_trainer.yaml`` (shipped in the verl
wheel) with Hydra's compose API, applying the verl keys our settings decide
(:func:`derived_overrides`: the policy loss, verl's rollout-correction and staleness keys and
the trainer mode come from the ``lightningrl`` and ``async`` settings), then the user's
``verl`` overrides; Hydra rejects unknown verl keys, and overriding a key that our settings
decide is an error naming the setting to use instead. LightningRL's length limits default to
verl's rollout lengths. The result is verl's ``DictConfig`` with our settings under ``agentbolt``.
Composition does not import verl (it only reads its YAML), so it is cheap.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentbolt.errors import UserError, invalid_fields_message
from agentbolt.lightningrl import LightningRLConfig
from agentbolt.policies import Policies

from ._verl import check_verl_version

if TYPE_CHECKING:
    from omegaconf import DictConfig

ADVANTAGE_SENTINEL = "agentbolt"
"""``algorithm.adv_estimator``: LightningRL computes the advantages (see :mod:`agentbolt_verl.registry`)."""
LOSS_MODE = "agentbolt"
"""``actor_rollout_ref.actor.policy_loss.loss_mode``: the one registered policy loss
(:func:`agentbolt_verl.losses.compute_policy_loss_agentbolt`)."""

__all__ = [
    "AGENT_LOOP_NAME",
    "ASYNC_TRAINER_MODE",
    "TRAINER_MODE",
    "AgentboltSettings",
    "AsyncSettings",
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
ASYNC_TRAINER_MODE = "agentbolt_colocate_async"
"""``trainer.v1.trainer_mode`` of the binding's asynchronous trainer (verl's ``colocate_async``)."""
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
            names = [f.alias or name for name, f in cls.model_fields.items()]
            unknown = sorted(str(k) for k in data if k not in names)
            if unknown:
                raise ValueError(
                    f"unknown key(s) {', '.join(repr(k) for k in unknown)}; valid keys: {', '.join(names)}"
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


class AsyncSettings(_Strict):
    """Asynchronous training: verl 0.9.1's V1 ``colocate_async`` trainer (rollouts for the next
    batches keep running while the update runs; a rollout spans weight updates, each call tagged
    with the version that produced it). The staleness bound and the correction are LightningRL's
    (``max_staleness``, ``rollout_is``, ``rollout_rs``). ``async: true`` is ``{enabled: true}``."""

    enabled: bool = False
    """Use the asynchronous trainer (``trainer.v1.trainer_mode=agentbolt_colocate_async``)."""
    warmup_batches: float = Field(default=1.0, gt=0)
    """Batches submitted before the first update (``trainer.v1.colocate_async.num_warmup_batches``):
    how far generation runs ahead of training."""

    @model_validator(mode="before")
    @classmethod
    def _from_bool(cls, data: Any) -> Any:
        return {"enabled": data} if isinstance(data, bool) else data


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


PER_ROLE_REFUSAL = (
    "agentbolt.policies ({names}): agentbolt-verl trains one shared policy. One trained policy per role needs one "
    "verl actor/rollout worker group per policy (or several LoRA adapters in one FSDP actor and in vLLM), and verl "
    "0.9.1's trainer builds a single actor/rollout group whose vLLM server is started with max_loras=1 and one "
    "fixed LoRA name; see packages/algo-verl/README.md, 'Policies by role'. Train policies by role with "
    "agentbolt-torch (Trainer(agent, 'torch-grpo', policies=...)), or remove agentbolt.policies"
)
"""Why per-role policies are refused (verl 0.9.1)."""


class AgentboltSettings(_Strict):
    """The ``agentbolt`` section."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True, populate_by_name=True)

    store_url: str
    """Store the runners and the binding share, e.g. ``sqlite:///runs/agentbolt.db``."""
    lightningrl: LightningRLConfig = Field(default_factory=LightningRLConfig)
    """Every choice between spans and the loss: :class:`agentbolt.lightningrl.LightningRLConfig`'s
    fields (credit, advantage, ``agent_match``, length limits, missing rewards, loss aggregation,
    ``max_staleness``, ``rollout_is`` / ``rollout_rs``). The length limits default to verl's
    rollout lengths; verl's rollout-correction and staleness keys are derived from it
    (:func:`derived_overrides`)."""
    async_: AsyncSettings = Field(default_factory=AsyncSettings, alias="async")
    """``async`` in the file: the asynchronous trainer (off by default)."""
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    """The gateway."""
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    """Rollouts."""
    data: DataSettings = Field(default_factory=DataSettings)
    """Task files."""
    runners: RunnersSettings = Field(default_factory=RunnersSettings)
    """Runners the binding starts in verl's Ray cluster (off by default: runners run apart)."""
    policies: dict[str, Any] | None = None
    """Policies by role (:mod:`agentbolt.policies`, policy name -> ``{match: ...}``): only one
    shared policy (``null``, or one policy matching every agent) is accepted; per-role policies are
    refused (see the README's "Policies by role": verl 0.9.1 builds one actor/rollout worker group
    and serves at most one LoRA adapter)."""

    @model_validator(mode="after")
    def _one_policy(self) -> AgentboltSettings:
        if self.policies is not None and not Policies.from_value(self.policies).is_shared:
            raise ValueError(PER_ROLE_REFUSAL.format(names=", ".join(self.policies)))
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
        raise UserError(invalid_fields_message("invalid agentbolt-verl config", exc)) from None


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


_ENTROPY_KL_AGGREGATION = {"rollout-mean-token-mean": "seq-mean-token-mean"}
"""verl's ``loss_agg_mode`` for the entropy and KL terms, for LightningRL's aggregations verl has
no mode for (the policy-gradient term always uses LightningRL's weights): the per-rollout mean is
verl's per-sequence mean when each rollout makes one call."""


def derived_overrides(settings: AgentboltSettings) -> dict[str, Any]:
    """The verl keys our settings decide. Overriding them through ``verl`` is an error.

    The advantages and loss weights are LightningRL's (the binding's trainer computes them in
    place of verl's advantage step; ``algorithm.adv_estimator`` names a sentinel that refuses to
    run), the policy loss is :data:`agentbolt_verl.losses.LOSS_MODE`. verl's rollout-correction
    keys mirror the ``lightningrl`` fields of the same names (LightningRL computes the weights;
    ``bypass_mode`` stays off: the PPO ratio is against verl's recomputed ``old_log_probs``), and
    ``max_staleness`` K becomes the V1 replay buffer's ``max_off_policy_threshold`` K + 1 (verl
    counts the versions a sample spans, the trained one included).
    """
    lrl = settings.lightningrl
    aggregation = lrl.loss_aggregation
    asynchronous = settings.async_
    out: dict[str, Any] = {
        "algorithm.adv_estimator": ADVANTAGE_SENTINEL,
        "critic.enable": False,
        "actor_rollout_ref.actor.policy_loss.loss_mode": LOSS_MODE,
        "actor_rollout_ref.actor.loss_agg_mode": _ENTROPY_KL_AGGREGATION.get(aggregation, aggregation),
        "algorithm.rollout_correction.rollout_is": lrl.rollout_is,
        "algorithm.rollout_correction.rollout_is_threshold": lrl.rollout_is_threshold,
        "algorithm.rollout_correction.rollout_is_batch_normalize": lrl.rollout_is_batch_normalize,
        "algorithm.rollout_correction.rollout_rs": lrl.rollout_rs,
        "algorithm.rollout_correction.rollout_rs_threshold": lrl.rollout_rs_threshold,
        "algorithm.rollout_correction.bypass_mode": False,
        "trainer.v1.sampler.max_off_policy_threshold": None if lrl.max_staleness is None else lrl.max_staleness + 1,
        "trainer.v1.sampler.max_off_policy_strategy": "drop",
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.agent.default_agent_loop": AGENT_LOOP_NAME,
        "actor_rollout_ref.rollout.agent.agent_loop_config_path": str(agent_loop_config_path()),
        "actor_rollout_ref.model.external_lib": EXTERNAL_LIB,
        "trainer.use_v1": True,
        "trainer.v1.trainer_mode": ASYNC_TRAINER_MODE if asynchronous.enabled else TRAINER_MODE,
        "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook": WORKER_SETUP_HOOK,
    }
    if asynchronous.enabled:
        out["trainer.v1.colocate_async.num_warmup_batches"] = asynchronous.warmup_batches
    return out


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


def compose_verl_config(
    config: TrainConfig | Mapping[str, Any] | str | os.PathLike[str], *, extra: Sequence[str] = ()
) -> DictConfig:
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
            f"verl key(s) {', '.join(clashes)} are set by agentbolt's settings (lightningrl, async, and the "
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
        calculate_log_probs = bool(OmegaConf.select(cfg, "actor_rollout_ref.rollout.calculate_log_probs"))
        kl_in_reward = bool(OmegaConf.select(cfg, "algorithm.use_kl_in_reward"))
    except (OmegaConfBaseException, TypeError, ValueError) as exc:
        raise UserError(f"cannot resolve the rollout prompt/response lengths: {exc}") from None
    lrl = settings.lightningrl
    for name, limit, verl_key in (
        ("max_prompt_length", prompt_length, "prompt_length"),
        ("max_response_length", response_length, "response_length"),
    ):
        value = getattr(lrl, name)
        if value is not None and value > limit:
            raise UserError(
                f"agentbolt.lightningrl.{name} ({value}) exceeds actor_rollout_ref.rollout.{verl_key} ({limit}): "
                "verl's tensors are that wide"
            )
    lrl = lrl.replace(
        max_prompt_length=lrl.max_prompt_length or prompt_length,
        max_response_length=lrl.max_response_length or response_length,
    )
    if kl_in_reward:
        raise UserError(
            "algorithm.use_kl_in_reward=true: the rewards are LightningRL's credit, verl's reward-side KL is not "
            "applied; use actor_rollout_ref.actor.use_kl_loss=true (a KL term in the loss) instead"
        )
    if lrl.correction is not None and not calculate_log_probs:
        raise UserError(
            "agentbolt.lightningrl.rollout_is / rollout_rs need the sampling logprobs in verl's batch: set "
            "actor_rollout_ref.rollout.calculate_log_probs=true"
        )
    resolved = settings.model_copy(update={"lightningrl": lrl})
    with open_dict(cfg):
        cfg.agentbolt = OmegaConf.create(resolved.model_dump(mode="json", by_alias=True))
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
        raise UserError(invalid_fields_message("invalid agentbolt-verl config", exc)) from None
