"""The trainer side of the binding (verl-free): weight sync ↔ gateway, LightningRL's advantage step, metrics.

verl's synchronous V1 trainer (``PPOTrainerSync``) wakes and sleeps the vLLM replicas around
each training step. The gateway must follow, or agents' calls would reach sleeping replicas:

====================  =========================================  ===============================
verl hook             verl does                                  then / before, we do
====================  =========================================  ===============================
``on_init_end``       ``update_weights`` (replicas awake)         set upstreams, publish
                                                                  resources, resume the gateway
``on_sample_end``     ``sleep_replicas``                          *before*: pause the gateway,
                                                                  drain in-flight calls (abort
                                                                  the replicas' requests if the
                                                                  drain times out)
``on_step_end``       ``update_weights`` (new weights, awake)     publish resources, resume
====================  =========================================  ===============================

verl's asynchronous ``colocate_async`` trainer has the same three hooks (it also aborts the
replicas' unfinished requests before sleeping them, and resumes generation after the update):
the gateway drains first, so a call either finishes on the old weights or waits at the paused
gateway for the new ones; the rollout itself keeps running across the update.

The mixin also replaces verl's advantage step (``_compute_advantage``) with LightningRL's:
:func:`agentbolt_verl.columns.verl_columns` on the batch's rows, through two hooks the verl
trainer implements over TransferQueue (:meth:`AgentboltTrainerMixin._agentbolt_read_batch`,
:meth:`~AgentboltTrainerMixin._agentbolt_write_columns`).

:class:`AgentboltTrainerMixin` implements all this over any object with verl's trainer
attributes, so tests drive it with fakes; :mod:`.trainer` mixes it into ``PPOTrainerSync`` and
``PPOTrainerColocateAsync``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from agentbolt.store import Store
from agentbolt.store.run_records import finite_metrics
from agentbolt.types import LLMEndpoint, Resources

from ..columns import VerlColumns, verl_columns
from ..config import AgentboltSettings, settings_from_verl_config
from .gateway import GatewayControl, make_gateway_control, upstream_urls
from .rollouts import MetricsSink

if TYPE_CHECKING:  # the class the mixin goes into, for the type checker (this module stays verl-free)
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer as _VerlTrainer
else:
    _VerlTrainer = object

__all__ = [
    "AgentboltTrainerMixin",
    "AsyncBridge",
    "BatchFields",
    "WeightSyncCoordinator",
    "sampling_from_verl_config",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

WEIGHTS_VERSION_KEY = "verl_weights_version"
"""``Resources.extra`` key holding verl's weight version (``global_steps`` at the update)."""


class AsyncBridge:
    """Runs coroutines on one background event loop, for synchronous callers (verl's hooks).

    One loop for the trainer's lifetime, so clients bound to a loop (the gateway's, the
    store's) keep working across calls.
    """

    def __init__(self, name: str = "agentbolt-verl-bridge") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the bridge's loop and return its result (re-raising its exception)."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self._name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            loop = self._loop
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    def close(self) -> None:
        """Stop the loop (idempotent)."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            loop.close()


def sampling_from_verl_config(cfg: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Training and validation sampling parameters of verl's rollout config.

    verl's actor divides logits by ``rollout.temperature`` when it recomputes log-probs, so the
    gateway must force these on every call (DESIGN §5).
    """
    r = cfg.actor_rollout_ref.rollout
    train = {
        "temperature": float(r.temperature),
        "top_p": float(r.top_p),
        "top_k": int(r.top_k),
        "max_tokens": int(r.response_length),
    }
    v = r.val_kwargs
    val = {"temperature": float(v.temperature), "top_p": float(v.top_p), "top_k": int(v.top_k)}
    val["max_tokens"] = train["max_tokens"]
    return train, val


class WeightSyncCoordinator:
    """Keeps the gateway and the published resources in step with verl's replicas.

    Args:
        gateway: the gateway's control surface.
        store: where resources are published (``None``: publish nothing).
        base_url: gateway URL agents use (``Resources.llm.base_url``).
        model_name: model name agents send.
        sampling: sampling parameters the gateway forces on training calls.
        val_sampling: the same for validation rollouts (``Resources.extra["val_sampling"]``).
        drain_timeout_s: how long in-flight calls may take once the gateway is paused.
    """

    def __init__(
        self,
        gateway: GatewayControl,
        *,
        store: Store | None = None,
        base_url: str | None = None,
        model_name: str = "policy",
        sampling: Mapping[str, Any] | None = None,
        val_sampling: Mapping[str, Any] | None = None,
        drain_timeout_s: float = 120.0,
    ) -> None:
        self.gateway = gateway
        self.store = store
        self.base_url = base_url
        self.model_name = model_name
        self.sampling = dict(sampling or {})
        self.val_sampling = dict(val_sampling or {})
        self.drain_timeout_s = drain_timeout_s
        self.upstreams: list[str] = []
        self.state = "init"
        self.resources: Resources | None = None
        self.drain_timeouts = 0
        self.run_id: str | None = None

    # -- the run in the store (the dashboard's Runs page, `agentbolt runs`) -------------------------

    async def start_run(self, config: Mapping[str, Any]) -> None:
        """Record a running ``verl`` run with the binding's settings."""
        if self.store is not None:
            from agentbolt.store import RunSpec

            run = await self.store.start_run(RunSpec(algorithm="verl", model=self.model_name, config=dict(config)))
            self.run_id = run.run_id

    async def record_metrics(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record verl's step metrics (the finite numbers among them) under the run."""
        if self.store is None or self.run_id is None:
            return
        values = finite_metrics(metrics)
        try:
            await self.store.add_run_metrics(self.run_id, step, values)
        except Exception as exc:  # never stop verl's training for the dashboard
            logger.warning("could not record step %d metrics in the store: %s", step, exc)

    async def finish_run(self, status: str = "succeeded") -> None:
        """Give the run its final status."""
        if self.store is not None and self.run_id is not None:
            from agentbolt.store import RunStatus

            await self.store.finish_run(self.run_id, RunStatus(status))

    async def replicas_awake(self, addresses: Sequence[str], weights_version: int) -> Resources | None:
        """The replicas serve ``weights_version``: route to them, publish, resume the gateway."""
        urls = upstream_urls(addresses)
        if urls != self.upstreams:
            await self.gateway.set_upstreams(urls)
            self.upstreams = urls
        if self.store is not None:
            self.resources = await self.store.add_resources(
                Resources(
                    llm=LLMEndpoint(base_url=self.base_url, model=self.model_name, sampling=self.sampling)
                    if self.base_url
                    else None,
                    extra={
                        WEIGHTS_VERSION_KEY: int(weights_version),
                        "val_sampling": self.val_sampling,
                        "upstreams": urls,
                    },
                )
            )
        set_policy = getattr(self.gateway, "set_policy", None)
        if callable(set_policy) and self.resources is not None:
            # each call's span records the version live when it ran: a rollout that spans a weight
            # update keeps a version per call (staleness is measured per call)
            await set_policy(version=self.resources.version)
        await self.gateway.resume()
        self.state = "serving"
        logger.info("gateway serving weights version %s from %d replica(s)", weights_version, len(urls))
        return self.resources

    async def replicas_sleeping(self) -> bool:
        """The replicas are about to sleep: pause the gateway and drain it.

        Returns ``True`` when no call is in flight any more; ``False`` after ``drain_timeout_s``
        (the caller then aborts the replicas' requests).
        """
        await self.gateway.pause()
        self.state = "paused"
        drained = bool(await self.gateway.drain(self.drain_timeout_s))
        if not drained:
            self.drain_timeouts += 1
            logger.warning("gateway did not drain within %.0fs; in-flight calls will be aborted", self.drain_timeout_s)
        return drained

    @classmethod
    def from_settings(
        cls, settings: AgentboltSettings, verl_cfg: Any, *, store: Store | None = None
    ) -> WeightSyncCoordinator:
        """Build the gateway control named in the settings; sampling from verl's rollout config."""
        sampling, val_sampling = sampling_from_verl_config(verl_cfg)
        gw = settings.gateway
        return cls(
            make_gateway_control(gw.control, url=gw.url),
            store=store,
            base_url=gw.url,
            model_name=gw.model_name,
            sampling=sampling,
            val_sampling=val_sampling,
            drain_timeout_s=gw.drain_timeout_s,
        )


@dataclass
class BatchFields:
    """The fields of a verl batch that LightningRL's advantage step reads (rows in batch order)."""

    extras: list[Mapping[str, Any] | None]
    """Each row's ``extra_fields["agentbolt"]``; ``None`` for verl's padding rows."""
    prompts: list[list[int]]
    """Prompt ids of each row."""
    responses: list[list[int]]
    """Response ids of each row."""
    response_mask: Any
    """(B, R) right-padded response masks (a torch tensor)."""
    rollout_log_probs: Any = None
    """(B, R) sampling logprobs, when verl has them."""
    old_log_probs: Any = None
    """(B, R) verl's recomputed logprobs, when computed."""


class AgentboltTrainerMixin(_VerlTrainer):
    """verl trainer hooks for the binding; mix in before verl's ``PPOTrainerSync``.

    Uses these attributes of verl's ``PPOTrainer``: ``config``, ``llm_server_manager``
    (``get_addresses()``), ``checkpoint_manager`` (``abort_replicas()``) and ``global_steps``.
    The coordinator, bridge and metrics sink are built on first use; tests may set
    ``_agentbolt_coordinator``, ``_agentbolt_bridge`` and ``_agentbolt_sink`` beforehand.
    """

    _agentbolt_coordinator: WeightSyncCoordinator | None = None
    _agentbolt_bridge: AsyncBridge | None = None
    _agentbolt_sink: MetricsSink | None = None
    _agentbolt_settings: AgentboltSettings | None = None
    _agentbolt_runners: Any = None

    # -- wiring ---------------------------------------------------------------------------------

    def _agentbolt_config(self) -> AgentboltSettings:
        if self._agentbolt_settings is None:
            self._agentbolt_settings = settings_from_verl_config(self.config)
        return self._agentbolt_settings

    def _agentbolt_run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._agentbolt_bridge is None:
            self._agentbolt_bridge = AsyncBridge()
        return self._agentbolt_bridge.run(coro)

    def _agentbolt_make_sink(self) -> MetricsSink | None:
        """The sink the agent loops report their counts to (the verl trainer returns Ray's)."""
        return None

    def _agentbolt_get_coordinator(self) -> WeightSyncCoordinator:
        if self._agentbolt_coordinator is None:
            settings = self._agentbolt_config()

            async def build() -> WeightSyncCoordinator:
                from agentbolt.store import open_store

                coordinator = WeightSyncCoordinator.from_settings(
                    settings,
                    self.config,
                    store=open_store(settings.store_url),
                )
                await coordinator.start_run(settings.model_dump(mode="json"))
                return coordinator

            self._agentbolt_coordinator = self._agentbolt_run(build())
        return self._agentbolt_coordinator

    def _agentbolt_start_runners(self) -> None:
        """With ``agentbolt.runners.ray``: the runner fleet as Ray actors in the cluster this
        process is connected to (verl's), not a second fleet."""
        runners = self._agentbolt_config().runners
        if not runners.ray or self._agentbolt_runners is not None:
            return
        from agentbolt.runners.ray import RayRunnerPool, RayWorkerOptions
        from agentbolt.runners.runner import RunnerConfig

        assert runners.agent is not None
        pool = RayRunnerPool(
            runners.agent,
            self._agentbolt_config().store_url,
            workers=runners.workers,
            config=RunnerConfig(concurrency=runners.concurrency, lease_s=runners.lease_s),
            options=RayWorkerOptions(
                num_cpus=runners.num_cpus, resources=runners.resources, max_restarts=runners.max_restarts
            ),
            name="verl-runner",
        )
        pool.start()
        self._agentbolt_runners = pool
        statuses = pool.wait_ready()
        logger.info("started %d agentbolt runner actors in verl's Ray cluster: %s", len(statuses), statuses)

    def _agentbolt_stop_runners(self) -> None:
        pool, self._agentbolt_runners = self._agentbolt_runners, None
        if pool is not None:
            pool.stop()

    def _agentbolt_awake(self) -> None:
        coordinator = self._agentbolt_get_coordinator()
        addresses = self.llm_server_manager.get_addresses()
        self._agentbolt_run(coordinator.replicas_awake(addresses, int(self.global_steps)))

    def _agentbolt_asleep(self) -> None:
        coordinator = self._agentbolt_get_coordinator()
        if not self._agentbolt_run(coordinator.replicas_sleeping()):
            self.checkpoint_manager.abort_replicas()

    # -- verl hooks -----------------------------------------------------------------------------

    def on_init_end(self) -> None:
        super().on_init_end()  # verl: update_weights → replicas awake
        self._agentbolt_start_runners()
        self._agentbolt_awake()

    def on_sample_end(self) -> None:
        self._agentbolt_asleep()
        super().on_sample_end()  # verl: sleep_replicas

    def on_step_end(self) -> None:
        super().on_step_end()  # verl: update_weights → replicas awake
        self._agentbolt_awake()

    def on_train_end(self) -> None:
        super().on_train_end()
        self._agentbolt_stop_runners()
        coordinator, bridge = self._agentbolt_coordinator, self._agentbolt_bridge
        if bridge is not None:
            if coordinator is not None and coordinator.store is not None:
                bridge.run(coordinator.finish_run())
                bridge.run(coordinator.store.close())
            bridge.close()

    def _agentbolt_read_batch(self, batch: Any) -> BatchFields:
        """The batch's fields (verl: from TransferQueue); implemented by the verl trainer."""
        raise NotImplementedError

    def _agentbolt_write_columns(self, batch: Any, columns: VerlColumns) -> None:
        """Store ``advantages``, ``returns``, the loss weights and the response mask (verl: into
        TransferQueue); implemented by the verl trainer."""
        raise NotImplementedError

    def _compute_advantage(self, batch: Any, metrics: dict[str, Any]) -> Any:
        """LightningRL in place of verl's advantage step (and verl's rollout correction): the
        staleness bound measured from the weights being trained (version ``global_steps - 1``),
        advantages, correction and loss weights, written back for the actor's policy loss."""
        fields = self._agentbolt_read_batch(batch)
        columns = verl_columns(
            fields.extras,
            fields.prompts,
            fields.responses,
            fields.response_mask,
            self._agentbolt_config().lightningrl,
            trained_version=int(self.global_steps) - 1,
            rollout_log_probs=fields.rollout_log_probs,
            old_log_probs=fields.old_log_probs,
        )
        metrics.update(columns.metrics)
        self._agentbolt_write_columns(batch, columns)
        return batch

    def _compute_metrics(self, batch: Any, metrics: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        out = super()._compute_metrics(batch, metrics, *args, **kwargs)
        if self._agentbolt_sink is None:
            self._agentbolt_sink = self._agentbolt_make_sink()
        if self._agentbolt_sink is not None:
            metrics.update(self._agentbolt_sink.drain())
        if self._agentbolt_coordinator is not None:
            metrics["agentbolt/gateway/drain_timeouts"] = float(self._agentbolt_coordinator.drain_timeouts)
            step = int(self.global_steps)
            self._agentbolt_run(self._agentbolt_coordinator.record_metrics(step, metrics))
        return out
