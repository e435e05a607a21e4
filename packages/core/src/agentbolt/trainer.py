"""The trainer: wires a store, the gateway, runners and an algorithm together.

    trainer = Trainer(my_agent, "torch-grpo", store="sqlite:///runs.db", runners=RunnerOptions(n=2))
    trainer.fit(train_items, val_items)

    # Before a GPU run: check what gets captured against any OpenAI-compatible endpoint.
    report = Trainer(my_agent).dev(dataset, llm="http://127.0.0.1:8000/v1", model="qwen")

``RunnerOptions(n=N, concurrency=M)``: N runner processes each run M rollouts at once; ``n=0``
runs one runner inside this process (handy with ``memory://`` or a debugger). With
``kind="ray"`` the N workers are Ray actors on the cluster at ``ray_address`` (a local one when
``None``); see :mod:`agentbolt.runners.ray`. The option groups (runners, gateway, capture) are
:mod:`agentbolt.options`, shared with the ``agentbolt`` command line.
"""

from __future__ import annotations

import asyncio
import logging
import textwrap
import time
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from . import types as t
from .algorithm import Algorithm, AlgorithmContext, Evaluate, EvaluateResult, NullProgress, as_tasks
from .errors import UserError
from .gateway import Upstream
from .lightningrl.config import LightningRLConfig
from .options import CaptureOptions, GatewayOptions, RunnerOptions, RunOptions
from .plugins.registry import default_plugins
from .policies import Policies
from .progress_lines import LineProgress
from .runners.pool import RunnerPool
from .runners.runner import Runner
from .runs.recorder import RunRecorder
from .runs.summary import RunSummary, run_summary
from .store import DEFAULT_STORE_URL, RolloutSearch, Store, open_store

__all__ = ["Trainer"]

log = logging.getLogger(__name__)


class _RichProgress:
    """Progress bars for algorithm phases and a line of the latest metrics."""

    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[metrics]}"),
            console=console,
            transient=False,
        )
        self.last_metrics = ""

    def phase(self, description: str, total: int | None) -> _Phase:
        task_id = self.progress.add_task(description, total=total, metrics=self.last_metrics)
        return _Phase(self.progress, task_id)

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        shown = list(values.items())[:4]
        self.last_metrics = f"step {step}: " + "  ".join(f"{k.split('/')[-1]}={v:.3g}" for k, v in shown)
        self.progress.console.log(f"step {step}: " + ", ".join(f"{k}={v:.4g}" for k, v in values.items()))


class _Phase:
    def __init__(self, progress: Progress, task_id: Any) -> None:
        self.progress = progress
        self.task_id = task_id

    def advance(self, n: int = 1) -> None:
        self.progress.advance(self.task_id, n)

    def done(self) -> None:
        self.progress.update(self.task_id, visible=True)
        self.progress.stop_task(self.task_id)


class Trainer:
    """Runs an algorithm over an agent. See the module docstring.

    Args:
        agent: the agent: a function ``(task, resources) -> float | None`` (sync or async), an
            object with such a ``rollout`` method, or ``"module:attr"``; or an environment of
            another framework that a plugin registers (:mod:`agentbolt.environments`: a verifiers
            ``Env`` object, ``"verifiers://NAME"`` for an installed one, with agentbolt-verifiers).
        algorithm: an :class:`~agentbolt.algorithm.Algorithm`, or the name of a registered one.
        algorithm_config: keyword arguments for a named algorithm.
        lightningrl: the transitions → loss choices (credit, advantage, ``agent_match``,
            ``loss_aggregation``, ...) for a named algorithm, passed to its factory as
            ``lightningrl=``: a :class:`~agentbolt.lightningrl.LightningRLConfig` or a mapping of
            its fields. An algorithm instance takes it in its own constructor instead.
        store: a store URL (default ``sqlite:///agentbolt.db``) or an open store.
        runners: how rollouts run: :class:`~agentbolt.options.RunnerOptions` (``n`` runner
            processes, 0 for one inside this process; ``concurrency``; ``max_attempts``,
            ``timeout_s``, ``lease_s``; ``restarts``; ``kind="ray"``, ``ray_address``,
            ``ray_options``) or a mapping of its fields.
        gateway: :class:`~agentbolt.options.GatewayOptions` (``upstreams`` the gateway starts
            with, ``host``, ``port``, ``token``, ``upstream_timeout_s``) or a mapping of its fields.
        capture: :class:`~agentbolt.options.CaptureOptions` (``token_ids``, ``tokenizer``,
            ``agent_names``, ``adapters``) or a mapping of its fields.
        policies: policies by role (:mod:`agentbolt.policies`): policy name -> ``match(...)``
            (e.g. ``{"writer": match("write_query"), "rewriter": match("rewrite_query")}``), one
            trained policy (a LoRA adapter on the shared base) per role; ``None`` (default) is one
            shared policy for every agent. The gateway routes each call to its agent's policy by
            the agent name it knows when the call is made (the ``X-Agentbolt-Agent-Name`` header or
            ``capture.agent_names``); the algorithm (``ctx.policies``) serves and trains each.
        metrics_path: JSONL file for per-step metrics.
        progress: draw progress bars and a summary on a terminal, whole lines elsewhere (a log file:
            :class:`~agentbolt.progress_lines.LineProgress`); ``False`` logs only.
        run: what the run is recorded as (:class:`~agentbolt.options.RunOptions`: ``name``, and
            ``config``, more settings recorded with it, e.g. how the example names its held-out
            metric for the run's summary card) or a mapping of its fields.
    """

    def __init__(
        self,
        agent: Any,
        algorithm: Algorithm | str | None = None,
        *,
        algorithm_config: Mapping[str, Any] | None = None,
        lightningrl: LightningRLConfig | Mapping[str, Any] | None = None,
        store: str | Store = DEFAULT_STORE_URL,
        runners: RunnerOptions | Mapping[str, Any] | None = None,
        gateway: GatewayOptions | Mapping[str, Any] | None = None,
        capture: CaptureOptions | Mapping[str, Any] | None = None,
        policies: Policies | Mapping[str, Any] | None = None,
        metrics_path: str | Path | None = None,
        progress: bool = True,
        run: RunOptions | Mapping[str, Any] | None = None,
    ) -> None:
        self.agent = agent
        self.algorithm = algorithm
        self.algorithm_config = dict(algorithm_config or {})
        if lightningrl is not None:
            if not isinstance(algorithm, str):
                raise UserError(
                    "lightningrl= configures a named algorithm (Trainer(agent, 'torch-grpo', lightningrl=...)); "
                    "pass it to the algorithm's own constructor instead"
                )
            if "lightningrl" in self.algorithm_config:
                raise UserError("lightningrl is given twice: as Trainer(lightningrl=) and in algorithm_config")
            self.algorithm_config["lightningrl"] = LightningRLConfig.from_value(lightningrl)
        self.store_spec = store
        self.runners = RunnerOptions.from_value(runners, option="runners")
        self.gateway = GatewayOptions.from_value(gateway, option="gateway")
        self.capture = CaptureOptions.from_value(capture, option="capture")
        self.policies = Policies.from_value(policies)
        self.runner_config = self.runners.config(self.capture)
        self.metrics_path = Path(metrics_path) if metrics_path else None
        self.show_progress = progress
        self.run = RunOptions.from_value(run, option="run")
        self.console = Console(stderr=True)
        self._gateway_capture = self.capture.gateway_options()  # loads the tokenizer now: errors before any work
        if not self.policies.is_shared:
            self._gateway_capture["policy_router"] = self.policies.router()
        if self.runners.n > 0 and not isinstance(store, str):
            raise UserError(
                "runner processes open the store themselves: pass store as a URL, or use runners=RunnerOptions(n=0)"
            )
        if self.runners.n > 0 and isinstance(store, str) and store.startswith("memory:"):
            raise UserError(
                "a memory:// store lives in one process: use sqlite:///path.db, or runners=RunnerOptions(n=0)"
            )

    # -- public API -----------------------------------------------------------------------------

    def fit(
        self, train: Sequence[Any] | None = None, val: Sequence[Any] | None = None, *, max_staleness: int | None = None
    ) -> Any:
        """Run the algorithm on ``train`` (and ``val``); returns what the algorithm returns.

        ``max_staleness=K`` trains asynchronously: rollouts for the next batches run while the
        policy updates, and calls sampled more than K policy versions before the one being
        trained are dropped and counted (``0``: on-policy). It sets the algorithm's
        :attr:`LightningRLConfig.max_staleness <agentbolt.lightningrl.LightningRLConfig.max_staleness>`
        (:meth:`Algorithm.set_max_staleness <agentbolt.algorithm.Algorithm.set_max_staleness>`;
        an algorithm instance is changed in place); ``None`` keeps what the algorithm has.
        """
        return _run(self.afit(train, val, max_staleness=max_staleness))

    def dev(
        self,
        dataset: Sequence[Any],
        *,
        llm: str | Upstream | None = None,
        model: str | None = None,
        api_key: str | None = None,
        n_samples: int = 1,
        sampling: Mapping[str, Any] | None = None,
        in_process: bool = True,
    ) -> EvaluateResult:
        """Evaluate the agent on ``dataset`` through the gateway, learning nothing, and report
        rewards and what was captured: the :mod:`agentbolt.runs.doctor` report of the run (token
        sources, drift, failed vs missing calls, adapters, agent names, group sizes).

        ``llm`` is any OpenAI-compatible endpoint (defaults to the trainer's ``upstream``).
        ``in_process`` (default) runs the rollouts on one runner inside this process, where the
        agent's framework is already imported, instead of starting ``runners.n`` processes that
        each import it again (``benchmarks/dev_startup.py`` measures the difference).
        """
        upstreams = list(self.gateway.upstreams)
        if llm is not None:
            upstreams = [Upstream(base_url=llm, api_key=api_key, model=model) if isinstance(llm, str) else llm]
        if not upstreams:
            raise UserError("dev() needs an endpoint: pass llm='http://host:port/v1' (any OpenAI-compatible server)")
        saved = self.gateway, self.runners
        self.gateway = self.gateway.model_copy(update={"upstreams": tuple(upstreams)})
        if in_process:
            self.runners = self.runners.model_copy(update={"n": 0})
        try:
            result = _run(
                self._run_algorithm(Evaluate(n_samples, model=model, sampling=sampling), [], as_tasks(dataset))
            )
        finally:
            self.gateway, self.runners = saved
        if self.show_progress:
            self._print_evaluate(result)
        return result

    async def afit(
        self, train: Sequence[Any] | None = None, val: Sequence[Any] | None = None, *, max_staleness: int | None = None
    ) -> Any:
        """:meth:`fit` for callers already on an event loop."""
        algorithm = self._make_algorithm()
        if max_staleness is not None:
            algorithm.set_max_staleness(max_staleness)
        return await self._run_algorithm(algorithm, as_tasks(train), as_tasks(val))

    # -- internals ------------------------------------------------------------------------------

    def _make_algorithm(self) -> Algorithm:
        if self.algorithm is None:
            algorithm: Any = Evaluate(**self.algorithm_config)
        elif isinstance(self.algorithm, Algorithm):
            algorithm = self.algorithm
        else:
            factory = default_plugins().algorithms.get(self.algorithm)
            algorithm = factory(**self.algorithm_config)
            if not isinstance(algorithm, Algorithm):
                raise UserError(
                    f"algorithm {self.algorithm!r} built a {type(algorithm).__name__}, not an agentbolt Algorithm"
                )
        if not self.policies.is_shared and not algorithm.supports_policies:
            raise UserError(
                f"algorithm {algorithm.name!r} trains one shared policy; policies by role "
                f"({', '.join(self.policies)}) need an algorithm that serves and trains several (torch-grpo, "
                "torch-sft), or leave policies=None"
            )
        return algorithm

    async def _run_algorithm(self, algorithm: Algorithm, train: list[t.Task], val: list[t.Task]) -> Any:
        started = time.monotonic()
        async with AsyncExitStack() as stack:
            store = open_store(self.store_spec) if isinstance(self.store_spec, str) else self.store_spec
            if isinstance(self.store_spec, str):
                stack.push_async_callback(store.close)
            gateway = self.gateway.thread(
                self.store_spec
                if isinstance(self.store_spec, str) and not self.store_spec.startswith("memory:")
                else store,
                self._gateway_capture,
            )
            await asyncio.to_thread(gateway.start)
            stack.callback(gateway.stop)
            progress: Any = NullProgress()
            if self.show_progress and self.console.is_terminal:
                rich_progress = _RichProgress(self.console)
                stack.enter_context(rich_progress.progress)
                progress = rich_progress
            elif self.show_progress:  # a log file or CI: whole lines, not bars drawn once at the end
                progress = LineProgress(self.console)
            runner_tasks = await self._start_runners(stack, store)
            ctx = AlgorithmContext(
                store=store,
                gateway=gateway,
                progress=progress,
                max_attempts=self.runners.max_attempts,
                timeout_s=self.runners.timeout_s,
                metrics_path=self.metrics_path,
                policies=self.policies,
            )
            stack.push_async_callback(algorithm.close)
            recorder = RunRecorder(store, ctx, algorithm, name=self.run.name, extra_config=dict(self.run.config))
            await recorder.start()
            algo_task = asyncio.ensure_future(recorder.watch(algorithm.run(ctx, train, val)))
            try:
                if runner_tasks:  # an in-process runner dying is fatal to the run
                    await asyncio.wait([algo_task, *runner_tasks], return_when=asyncio.FIRST_COMPLETED)
                    for task in runner_tasks:
                        error = task.exception() if task.done() else None
                        if error is not None:
                            algo_task.cancel()
                            raise error
                result = await algo_task
            finally:
                if not algo_task.done():
                    algo_task.cancel()
            counts = await _run_rollout_counts(store, ctx.run_id)
            card = await _run_card(store, ctx.run_id)
        if self.show_progress:
            self._print_summary(algorithm, result, counts, time.monotonic() - started, carded=card is not None)
            if card is not None:
                self._print_card(card)
        elif card is not None:  # progress off: the same card, as log lines
            _log_card(card)
        return result

    async def _start_runners(self, stack: AsyncExitStack, store: Store) -> list[asyncio.Task[Any]]:
        if self.runners.n == 0:
            runner = Runner(self.agent, store, worker_id="in-process", config=self.runner_config)
            stop = asyncio.Event()
            task = asyncio.ensure_future(runner.run(stop))

            async def stop_runner() -> None:
                stop.set()
                await task

            stack.push_async_callback(stop_runner)
            return [task]
        assert isinstance(self.store_spec, str)
        if self.runners.kind == "ray":
            return await self._start_ray_runners(stack)
        pool = self.runners.pool(self.agent, self.store_spec, self.runner_config)
        assert isinstance(pool, RunnerPool)
        stack.callback(pool.stop)  # also stops processes started before a failure or a signal
        await asyncio.to_thread(pool.start)
        await asyncio.to_thread(pool.wait_ready)
        watcher = asyncio.ensure_future(_watch_pool(pool))
        stack.callback(watcher.cancel)
        return [watcher]

    async def _start_ray_runners(self, stack: AsyncExitStack) -> list[asyncio.Task[Any]]:
        assert isinstance(self.store_spec, str)
        pool = self.runners.pool(self.agent, self.store_spec, self.runner_config, gateway_host=self.gateway.host)
        await asyncio.to_thread(pool.start)
        stack.callback(pool.stop)
        await asyncio.to_thread(pool.wait_ready)
        return []

    def _print_summary(
        self,
        algorithm: Algorithm,
        result: Any,
        counts: Mapping[t.RolloutStatus, int],
        seconds: float,
        *,
        carded: bool = False,
    ) -> None:
        """The algorithm's result as a table. A result may name its entries with a
        ``summary_labels`` mapping (key -> label); a key mapped to ``None`` is left out when the
        run's summary card follows (``carded``), which states it with its standard error."""
        table = Table(title=f"agentbolt: {algorithm.name} finished in {seconds:.1f} s", show_header=False)
        table.add_column("what")
        table.add_column("value", justify="right")
        for status, n in counts.items():
            if n:
                table.add_row(f"rollouts {status.value}", str(n))
        shown = {"rollouts", *(status.value for status in t.RolloutStatus)}  # the status rows above
        labels: Mapping[str, str | None] = getattr(result, "summary_labels", None) or {}
        summary = getattr(result, "to_dict", None)
        if callable(summary):
            for key, value in summary().items():
                if key in shown or isinstance(value, bool) or not isinstance(value, int | float | str):
                    continue
                label = labels.get(key, "seconds running rollouts" if key == "seconds" else key)
                if label is None:
                    if carded:
                        continue
                    label = key
                table.add_row(label, f"{value:.4g}" if isinstance(value, float) else str(value))
        self.console.print(table)
        details = getattr(result, "rich_summary", None)  # e.g. APO's table of prompt versions
        if callable(details):
            self.console.print(details())

    def _print_card(self, card: RunSummary) -> None:
        """The run's summary card (held-out before -> after, training reward, s/step) and its
        training-health findings, each with what to do (``agentbolt doctor`` has the numbers),
        wrapped to the console with continuation lines indented."""
        width = max(40, self.console.width)
        self.console.print(f"[bold]{card.run.run_id}[/bold]: did it learn?")
        for line in card.lines():
            wrapped = textwrap.fill(line, width, initial_indent="  ", subsequent_indent="      ")
            self.console.print(wrapped, markup=False, highlight=False, crop=False)
        for f in card.findings or ():
            colour = "yellow" if f.severity == "warning" else "red" if f.severity == "error" else "dim"
            head = f"{f.severity.upper()} {f.code}"
            text = Text(textwrap.fill(f"{head}: {f.message}. Fix: {f.fix}", width, subsequent_indent="    "))
            text.stylize(colour, 0, len(head))
            self.console.print(text, highlight=False, crop=False)

    def _print_evaluate(self, result: EvaluateResult) -> None:
        if result.failures:
            for kind, n in sorted(result.failures.items()):
                self.console.print(f"  failed: {kind} x{n}")
        status = "[green]ok[/green]" if result.capture_ok() else "[red]NOT ok[/red]"
        self.console.print(
            f"capture {status}: {result.llm_calls} LLM calls in the store: {result.calls_with_exact_ids} with exact "
            f"token ids, {result.calls_retokenized} retokenized, {result.calls_missing_ids} missing, "
            f"{result.calls_failed} failed upstream"
        )
        if result.report is not None:
            for line in result.report.render().splitlines()[:-1]:
                self.console.print(f"  {line}", markup=False, highlight=False)


def _log_card(card: RunSummary) -> None:
    """The summary card and its findings as INFO log lines (a warning finding as a WARNING)."""
    log.info("%s: did it learn?", card.run.run_id)
    for line in card.lines():
        log.info("  %s", line)
    for f in card.findings or ():
        log.log(
            logging.INFO if f.severity == "info" else logging.WARNING,
            "%s %s: %s. Fix: %s",
            f.severity.upper(),
            f.code,
            f.message,
            f.fix,
        )


async def _run_rollout_counts(store: Store, run_id: str) -> dict[t.RolloutStatus, int]:
    """How many of this run's rollouts are in each status (not the store's: it may hold other runs)."""
    counts: dict[t.RolloutStatus, int] = {}
    for status in t.RolloutStatus:
        page = await store.search_rollouts(RolloutSearch(run_id=run_id, status=[status], limit=1))
        counts[status] = page.total
    return counts


async def _run_card(store: Store, run_id: str) -> RunSummary | None:
    """The run's summary card, or ``None`` (logged) when it cannot be read: the summary never fails a run."""
    try:
        return await run_summary(store, run_id)
    except Exception as exc:
        log.warning("could not summarize run %s: %s", run_id, exc)
        return None


async def _watch_pool(pool: RunnerPool, period_s: float = 0.5) -> None:
    """Replace runner processes that die; raise (ending the run) when none is left."""
    while True:
        await asyncio.sleep(period_s)
        pool.watch()


def _run(coro: Any) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        try:
            import uvloop

            return uvloop.run(coro)
        except ImportError:  # pragma: no cover
            return asyncio.run(coro)
    raise UserError("fit()/dev() were called from a running event loop; await trainer.afit(...) instead")
