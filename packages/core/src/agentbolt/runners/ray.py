"""Runners as Ray actors: the runner fleet on an existing Ray cluster.

    pool = RayRunnerPool("my_pkg.agent:solve", "postgresql://db-host/agentbolt",
                         workers=8, address="10.0.0.2:6379",
                         options=RayWorkerOptions(num_cpus=1, resources={"sandbox": 1}))
    pool.start(); pool.wait_ready()
    ...
    pool.stop()

Each worker is one Ray actor holding one :class:`~agentbolt.runners.runner.Runner` (the same claim,
lease, heartbeat, timeout and drain code as a runner process, on its own event-loop thread in
the actor). Workers talk to the store by URL, so the store must be one every node can open:
PostgreSQL or the store server (``http://``); a SQLite file only when every node of the cluster
is this machine. The gateway URL the algorithm publishes must be reachable from the workers.

Failures: an actor that dies (its node lost, its process killed, out of memory) is restarted by
Ray (``max_restarts``); the new actor builds a new runner, with a new worker id, and goes on
claiming. The rollouts the dead one held stop heart-beating, the store expires their leases,
marks those attempts ``lost`` and hands the rollouts out again while attempts remain, exactly
as for a killed runner process. Progress and failures therefore show in the same store records
(and so in the trainer's progress line) as process runners'.

Without ``address`` and with no Ray connection in this process, :meth:`RayRunnerPool.start`
starts a local cluster (``num_cpus`` fixed, on 127.0.0.1, no dashboard) and shuts it down on
:meth:`~RayRunnerPool.stop`. Inside a process already connected to Ray (a verl TaskRunner, a
Ray job) the pool uses that connection and leaves it up.

Needs the ``ray`` extra: ``pip install 'agentbolt[ray]'``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ..errors import UserError
from ..store import open_store
from ..store.server.run import is_loopback
from .runner import AgentLike, Runner, RunnerConfig, load_agent

__all__ = [
    "RayRunnerPool",
    "RayWorkerOptions",
    "RunnerWorker",
    "WorkerStatus",
    "check_urls_for_cluster",
    "options_from_mapping",
    "parse_resources",
]

log = logging.getLogger(__name__)

_STORE_TOKEN_ENV = "AGENTBOLT_STORE_TOKEN"


@dataclass(frozen=True)
class RayWorkerOptions:
    """Where and how each Ray runner worker is placed."""

    num_cpus: float = 1.0
    """CPUs Ray reserves for each worker (its agent's threads run inside it)."""
    resources: Mapping[str, float] = field(default_factory=dict)
    """Custom Ray resources each worker needs, e.g. ``{"sandbox": 1}`` to land only on nodes
    started with ``ray start --resources '{"sandbox": 4}'``."""
    max_restarts: int = -1
    """How often Ray restarts a dead worker (``-1``: always, ``0``: never)."""
    runtime_env: Mapping[str, Any] | None = None
    """Ray runtime environment of the workers (``working_dir``, ``pip``, ``env_vars`` ...)."""
    forward_sys_path: bool = True
    """Put this process's ``sys.path`` entries (outside the Python installation) on the
    workers' ``PYTHONPATH``, as ``multiprocessing`` does for runner processes, so an agent
    imported from a script's folder imports on the workers too (same paths on every node)."""
    local_num_cpus: int = 2
    """CPUs of the local cluster started when there is no ``address`` and no Ray connection."""
    driver_node_ip: str | None = None
    """With ``address``: the address of this machine's Ray node, where Ray cannot tell which of
    the machine's addresses it is (several Ray nodes on one machine, on distinct addresses)."""

    def __post_init__(self) -> None:
        if self.num_cpus < 0:
            raise UserError(f"num_cpus must be 0 or more, got {self.num_cpus}")
        if self.max_restarts < -1:
            raise UserError(f"max_restarts must be -1 (always), 0 or more, got {self.max_restarts}")
        if self.local_num_cpus < 1:
            raise UserError(f"local_num_cpus must be at least 1, got {self.local_num_cpus}")


@dataclass
class WorkerStatus:
    """What one Ray runner worker reports."""

    index: int
    alive: bool
    worker_id: str | None = None
    """The current runner's worker id in the store (changes when Ray restarts the actor)."""
    pid: int | None = None
    node_ip: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    """The current runner's :class:`~agentbolt.runners.runner.RunnerStats` as a dict."""
    restarts_seen: int = 0
    """Restarts of this worker observed by the pool (a new process answered)."""


def _url_host(url: str) -> str | None:
    try:
        return urlsplit(url).hostname
    except ValueError:
        return None


def check_urls_for_cluster(store_url: str, *, cluster_is_local: bool, gateway_host: str | None = None) -> None:
    """Refuse URLs the workers could not use, with what to do instead (:class:`UserError`).

    ``cluster_is_local``: every node of the Ray cluster is this machine.
    """
    scheme = urlsplit(store_url).scheme.split("+", 1)[0].lower() if "://" in store_url else ""
    if scheme == "memory":
        raise UserError(
            "Ray runner workers cannot share a memory:// store; use PostgreSQL (postgresql://...) or the store "
            "server (agentbolt store serve, then http://HOST:PORT)"
        )
    if cluster_is_local:
        return
    if scheme == "sqlite":
        raise UserError(
            f"the store {store_url!r} is a SQLite file on this machine, but the Ray cluster has nodes on other "
            "machines that cannot open it. Serve it (agentbolt store serve --store ... --host ADDRESS --token ...) "
            "and pass http://ADDRESS:PORT, or use PostgreSQL (postgresql://HOST/DB)"
        )
    host = _url_host(store_url)
    if host and is_loopback(host):
        raise UserError(
            f"the store URL {store_url!r} names a loopback address, which Ray workers on other nodes cannot reach; "
            "use an address of this machine that the workers can reach"
        )
    if gateway_host and is_loopback(gateway_host):
        raise UserError(
            f"the gateway listens on {gateway_host!r}, which Ray workers on other nodes cannot reach; pass "
            "GatewayOptions(host=an address of this machine the workers reach, token=...) (a token is required "
            "beyond loopback)"
        )


class RunnerWorker:
    """The body of one Ray runner actor: a :class:`Runner` on the actor's own event-loop thread.

    Ray builds it with ``ray.remote`` (see :class:`RayRunnerPool`); it is a plain class so it can
    be read and tested without Ray. Every (re)start of the actor builds a new runner.
    """

    def __init__(
        self,
        agent: AgentLike | str,
        store_url: str,
        store_token: str | None,
        name: str,
        config: RunnerConfig,
        log_level: int,
    ) -> None:
        logging.basicConfig(level=log_level, format=f"%(asctime)s %(levelname)s [{name}] %(name)s: %(message)s")
        if log_level > logging.DEBUG:
            for noisy in ("httpx", "httpcore"):
                logging.getLogger(noisy).setLevel(max(log_level, logging.WARNING))
        self.pid = os.getpid()
        self.worker_id = f"{name}-{socket.gethostname()}-{self.pid}"
        self.node_ip = _node_ip()
        self._agent = agent
        self._store_url = store_url
        self._store_token = store_token
        self._config = config
        self._ready = threading.Event()
        self._done = threading.Event()
        self._error: str | None = None
        self._runner: Runner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name=f"agentbolt-{name}", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        try:
            import uvloop

            uvloop.run(self._run())
        except ImportError:  # pragma: no cover
            asyncio.run(self._run())

    async def _run(self) -> None:

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        store = None
        try:
            options = {"token": self._store_token} if self._store_token and _is_http(self._store_url) else {}
            store = open_store(self._store_url, **options)
            self._runner = Runner(self._agent, store, worker_id=self.worker_id, config=self._config)
            stats = await self._runner.run(self._stop, on_ready=self._ready.set)
            log.info("runner %s done: %s", self.worker_id, stats)
        except BaseException as exc:
            self._error = f"{type(exc).__name__}: {exc}"
            log.exception("runner %s failed", self.worker_id)
        finally:
            if store is not None:
                await store.close()
            self._done.set()
            self._ready.set()

    def ready(self, timeout_s: float) -> dict[str, Any]:
        """Wait until the runner claims work; its status. Raises if it failed to start."""
        if not self._ready.wait(timeout_s):
            raise RuntimeError(f"runner {self.worker_id} on {self.node_ip} was not ready after {timeout_s:.0f} s")
        if self._error is not None:
            raise RuntimeError(f"runner {self.worker_id} on {self.node_ip} failed: {self._error}")
        return self.status()

    def status(self) -> dict[str, Any]:
        """Worker id, pid, node, whether the runner is running, and its stats."""
        stats = dataclasses.asdict(self._runner.stats) if self._runner is not None else {}
        return {
            "worker_id": self.worker_id,
            "pid": self.pid,
            "node_ip": self.node_ip,
            "running": not self._done.is_set(),
            "error": self._error,
            "stats": stats,
        }

    def stop(self, timeout_s: float) -> dict[str, Any]:
        """Stop claiming, let running rollouts drain (the runner's ``drain_timeout_s``), hand back
        the rest; returns the final status."""
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._done.wait(timeout_s)
        return self.status()


def _is_http(url: str) -> bool:
    return url.split("://", 1)[0].lower() in ("http", "https")


def _node_ip() -> str:
    try:
        import ray

        return str(ray.util.get_node_ip_address())
    except Exception:  # outside Ray (tests of the class itself)
        return socket.gethostname()


def _forwarded_path() -> list[str]:
    """``sys.path`` entries of this process that are not part of the Python installation."""
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    out = []
    for entry in sys.path:
        path = os.path.realpath(entry or os.getcwd())
        if not os.path.isdir(path) or any(path == p or path.startswith(p + os.sep) for p in prefixes):
            continue
        if path not in out:
            out.append(path)
    return out


class RayRunnerPool:
    """Runner workers as Ray actors, working on a store given by URL. See the module docstring.

    Args:
        agent: the agent: ``"module:attr"`` or an object Ray can pickle (a module-level function
            or class is pickled by reference: its module must import on the workers).
        store_url: a URL every node can open: ``postgresql://...`` or ``http://...`` (store
            server); ``sqlite:///...`` only when the whole cluster is this machine.
        workers: how many actors.
        config: each worker's :class:`~agentbolt.runners.runner.RunnerConfig`.
        address: the Ray cluster (``"HOST:6379"``, ``"auto"``); ``None``: this process's Ray
            connection, else a new local cluster of ``options.local_num_cpus`` CPUs on 127.0.0.1.
        options: :class:`RayWorkerOptions` (CPUs, custom resources, restarts, runtime env).
        store_token: bearer token of the store server (default ``$AGENTBOLT_STORE_TOKEN``).
        gateway_host: where the gateway listens, checked to be reachable from other nodes.
        name: prefix of the workers' ids in the store.
    """

    def __init__(
        self,
        agent: AgentLike | str,
        store_url: str,
        *,
        workers: int = 1,
        config: RunnerConfig | None = None,
        address: str | None = None,
        options: RayWorkerOptions | None = None,
        store_token: str | None = None,
        gateway_host: str | None = None,
        name: str = "ray-runner",
    ) -> None:
        if workers < 1:
            raise UserError(f"workers must be at least 1, got {workers}")
        if not isinstance(store_url, str) or "://" not in store_url:
            raise UserError(f"Ray runner workers open the store by URL; got {store_url!r}")
        if store_url.startswith("memory:"):
            check_urls_for_cluster(store_url, cluster_is_local=True)
        if not isinstance(agent, str):
            load_agent(agent)  # validate early, here
        self.agent = agent
        self.store_url = store_url
        self.config = config or RunnerConfig()
        self.address = address
        self.options = options or RayWorkerOptions()
        self.store_token = store_token if store_token is not None else os.environ.get(_STORE_TOKEN_ENV) or None
        self.gateway_host = gateway_host
        self.actors: list[Any] = []
        self._n = workers
        self._name = name
        self._owns_ray = False
        self._last: dict[int, dict[str, Any]] = {}
        self._restarts: dict[int, int] = {}

    # -- cluster ------------------------------------------------------------------------------------

    def _connect(self) -> None:
        # Under `uv run`, Ray starts its workers with `uv run` again (which re-resolves the
        # project from the worker's directory); workers run this interpreter instead unless the
        # variable says otherwise. Ray reads it when first imported.
        os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
        try:
            import ray
        except ImportError:
            raise UserError("Ray runners need Ray: pip install 'agentbolt[ray]'") from None
        if ray.is_initialized():
            return
        if self.address is None:
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            ray.init(
                address="local",
                num_cpus=self.options.local_num_cpus,
                include_dashboard=False,
                _node_ip_address="127.0.0.1",
                log_to_driver=True,
            )
            log.info("started a local Ray cluster (%d CPUs, 127.0.0.1)", self.options.local_num_cpus)
        else:
            try:
                ray.init(address=self.address, log_to_driver=True, _node_ip_address=self.options.driver_node_ip)
            except ConnectionError as exc:
                raise UserError(
                    f"cannot connect to the Ray cluster at {self.address!r}: {exc}. Start it with "
                    "`ray start --head --node-ip-address ADDRESS` and pass ADDRESS:6379"
                ) from exc
        self._owns_ray = True

    @staticmethod
    def cluster_is_local() -> bool:
        """True when every live node of the connected Ray cluster is on this machine: this
        process's node, or a node on a loopback address (several nodes on one machine)."""
        import ray

        here = ray.get_runtime_context().get_node_id()
        return all(
            node["NodeID"] == here or is_loopback(str(node.get("NodeManagerAddress", "")))
            for node in ray.nodes()
            if node.get("Alive")
        )

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Connect to (or start) the cluster, check the URLs, create the actors."""
        import ray

        self._connect()
        try:
            check_urls_for_cluster(
                self.store_url, cluster_is_local=self.cluster_is_local(), gateway_host=self.gateway_host
            )
        except UserError:
            self._shutdown_owned()
            raise
        opts = self.options
        runtime_env = dict(opts.runtime_env or {})
        if opts.forward_sys_path:
            env_vars = dict(runtime_env.get("env_vars") or {})
            paths = _forwarded_path() + [p for p in env_vars.get("PYTHONPATH", "").split(os.pathsep) if p]
            env_vars["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
            runtime_env["env_vars"] = env_vars
        actor_cls = ray.remote(RunnerWorker).options(
            num_cpus=opts.num_cpus,
            resources=dict(opts.resources) or None,
            max_restarts=opts.max_restarts,
            max_task_retries=0,
            max_concurrency=4,  # status() answers while stop() waits for the drain
            runtime_env=runtime_env or None,
        )
        level = logging.getLogger("agentbolt").getEffectiveLevel()
        for i in range(self._n):
            name = f"{self._name}-{i}"
            self.actors.append(actor_cls.remote(self.agent, self.store_url, self.store_token, name, self.config, level))

    def wait_ready(self, timeout: float = 180.0) -> list[WorkerStatus]:
        """Block until every worker claims work (Ray placed it, imports done, store open).

        Raises:
            RuntimeError: a worker failed to start, could not be placed, or was not ready in time
                (for instance no node has the CPUs or custom resources it asks for).
        """
        import ray

        refs = [actor.ready.remote(timeout) for actor in self.actors]
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout + 5)
        if pending:
            resources = {"CPU": self.options.num_cpus, **self.options.resources}
            raise RuntimeError(
                f"{len(pending)} of {len(refs)} Ray runner workers were not ready after {timeout:.0f} s; does the "
                f"cluster have free {resources} for each? (cluster: {ray.cluster_resources()})"
            )
        out = []
        for i, ref in enumerate(refs):
            try:
                info = ray.get(ref)
            except ray.exceptions.RayError as exc:
                raise RuntimeError(f"Ray runner worker {i} failed to start: {_cause(exc)}") from None
            self._last[i] = info
            out.append(self._status(i, info))
        return out

    def status(self, timeout: float = 5.0) -> list[WorkerStatus]:
        """Each worker's status; a worker that does not answer in ``timeout`` (dead, being
        restarted) is reported not alive. A new pid behind a worker counts as a restart."""
        import ray

        refs = [actor.status.remote() for actor in self.actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        out = []
        for i, ref in enumerate(refs):
            info = None
            if ref in ready:
                try:
                    info = ray.get(ref)
                except ray.exceptions.RayError:
                    info = None
            if info is None:
                out.append(WorkerStatus(index=i, alive=False, restarts_seen=self._restarts.get(i, 0)))
                continue
            last = self._last.get(i)
            if last is not None and last["pid"] != info["pid"]:
                self._restarts[i] = self._restarts.get(i, 0) + 1
                log.warning(
                    "Ray runner worker %d was restarted: %s is now %s on %s",
                    i,
                    last["worker_id"],
                    info["worker_id"],
                    info["node_ip"],
                )
            self._last[i] = info
            out.append(self._status(i, info))
        return out

    def _status(self, i: int, info: Mapping[str, Any]) -> WorkerStatus:
        return WorkerStatus(
            index=i,
            alive=bool(info["running"]),
            worker_id=info["worker_id"],
            pid=info["pid"],
            node_ip=info["node_ip"],
            stats=dict(info["stats"]),
            restarts_seen=self._restarts.get(i, 0),
        )

    def alive(self) -> list[bool]:
        """Whether each worker answers and its runner runs."""
        return [s.alive for s in self.status()]

    def stop(self, timeout: float | None = None) -> None:
        """Drain every worker (the runner's graceful stop), then end the actors; shut down the
        local cluster if this pool started it."""
        import ray

        if not self.actors:
            self._shutdown_owned()
            return
        timeout = self.config.drain_timeout_s + 15 if timeout is None else timeout
        refs = [actor.stop.remote(timeout) for actor in self.actors]
        done, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout + 5)
        for ref in done:
            try:
                info = ray.get(ref)
                log.info("Ray runner %s stopped: %s", info["worker_id"], info["stats"])
            except ray.exceptions.RayError as exc:
                log.warning("a Ray runner worker failed while stopping: %s", _cause(exc))
        if pending:
            log.warning("%d Ray runner workers did not stop in %.0f s; killing them", len(pending), timeout)
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors.clear()
        self._shutdown_owned()

    def _shutdown_owned(self) -> None:
        if self._owns_ray:
            import ray

            ray.shutdown()
            self._owns_ray = False

    def __enter__(self) -> RayRunnerPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _cause(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)
    return str(cause) if cause is not None else str(exc)


def options_from_mapping(values: Mapping[str, Any] | RayWorkerOptions | None) -> RayWorkerOptions:
    """:class:`RayWorkerOptions` from keyword values (as config files and the CLI give them)."""
    if values is None:
        return RayWorkerOptions()
    if isinstance(values, RayWorkerOptions):
        return values
    names = {f.name for f in dataclasses.fields(RayWorkerOptions)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise UserError(f"unknown Ray worker option(s) {unknown}; valid: {sorted(names)}")
    return RayWorkerOptions(**dict(values))


def parse_resources(items: list[str]) -> dict[str, float]:
    """``["sandbox=1", "gpu_small=0.5"]`` → ``{"sandbox": 1.0, "gpu_small": 0.5}`` (CLI form)."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, amount = item.partition("=")
        try:
            if not sep or not name.strip():
                raise ValueError(item)
            out[name.strip()] = float(amount)
        except ValueError:
            raise UserError(f"a Ray resource is NAME=AMOUNT (e.g. sandbox=1), got {item!r}") from None
    return out
