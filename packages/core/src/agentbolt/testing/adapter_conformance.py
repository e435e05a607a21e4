"""The adapter conformance suite: what every framework adapter package must pass.

Subclass :class:`AdapterConformance` in the package's tests::

    class TestLangChainAdapter(AdapterConformance):
        adapter_name = "langchain"
        agent_names = {"writer", "checker"}

        def make_adapter(self):
            return LangChainAdapter()

        def make_agent(self):
            return my_real_langgraph_agent          # (task, resources) -> float | None

        def tasks(self):
            return [{"question": f"q{i}"} for i in range(6)]

        def make_backend(self):
            return FakeLLM(rules=[...])              # replies the agent needs (tool calls, ...)

Each test runs the real framework agent in ``Trainer.dev`` (in-process runner, memory store)
against the fake OpenAI backend through the gateway, then checks the spans and the
transitions LightningRL builds from them. Needs pytest and pytest-asyncio.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import importlib.resources
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from .. import semconv
from .. import types as t
from ..capture.adapters import Adapter
from ..errors import UserError
from ..lightningrl import LightningRL
from ..options import CaptureOptions, RunnerOptions
from ..plugins.registry import default_plugins
from ..store.memory import MemoryStore
from ..trainer import Trainer
from .fake_llm import FakeLLM, FakeLLMServer

__all__ = ["AdapterConformance", "AdapterRun"]


@dataclass
class AdapterRun:
    """What one ``Trainer.dev`` run left in the store."""

    rollouts: list[t.Rollout]
    spans: dict[str, list[t.Span]]
    transitions: list[t.Transition]
    report: Any

    def adapter_spans(self, rollout_id: str | None = None) -> list[t.Span]:
        rids = [rollout_id] if rollout_id else list(self.spans)
        return [s for r in rids for s in self.spans[r] if semconv.ADAPTER in s.attributes]

    def gateway_spans(self, rollout_id: str) -> list[t.Span]:
        return [s for s in self.spans[rollout_id] if semconv.TOKEN_SOURCE in s.attributes]


class AdapterConformance:
    """Behaviour every framework adapter shares. See the module docstring."""

    adapter_name: ClassVar[str] = ""
    """The name the adapter registers under (``agentbolt_register_adapters``)."""
    agent_names: ClassVar[set[str]] = set()
    """Agent names the transitions of :meth:`make_agent`'s runs must carry."""
    llm_calls_per_rollout: ClassVar[int | None] = None
    """Exact LLM calls per rollout, when the scripted agent makes a fixed number."""
    roots_per_rollout: ClassVar[int] = 1
    """Top-level framework runs :meth:`make_agent` makes per rollout (each is one tree)."""

    def make_adapter(self) -> Adapter:
        raise NotImplementedError

    def make_agent(self) -> Callable[[Any, t.Resources], Any]:
        raise NotImplementedError

    def tasks(self) -> Sequence[Any]:
        return [{"question": f"question {i}"} for i in range(6)]

    def make_backend(self) -> FakeLLM:
        return FakeLLM(default_reply="The answer is 42.")

    # -- helpers --------------------------------------------------------------------------------

    @pytest.fixture
    def adapter(self) -> Iterator[Adapter]:
        adapter = self.make_adapter()
        adapter.instrument()
        try:
            yield adapter
        finally:
            adapter.uninstrument()

    def run_dev(self, *, concurrency: int = 4, tasks: Sequence[Any] | None = None) -> AdapterRun:
        """Run the agent on :meth:`tasks` through the gateway and collect spans and transitions."""

        store = MemoryStore()  # type: ignore[abstract]  # Store's operations are derived from its declarations at run time (store.operations)
        with FakeLLMServer(self.make_backend()) as server:
            trainer = Trainer(
                self.make_agent(),
                store=store,
                runners=RunnerOptions(n=0, concurrency=concurrency),
                capture=CaptureOptions(adapters=[]),
                progress=False,
            )
            result = trainer.dev(
                list(tasks if tasks is not None else self.tasks()), llm=server.base_url, model="fake-model"
            )
        assert result.failed == 0, f"agent runs failed: {result.failures}"

        async def collect() -> AdapterRun:
            page = await store.query_rollouts(limit=10_000)
            rollouts = page.items
            spans = await store.query_spans([r.rollout_id for r in rollouts], latest_attempt_only=True)
            batch = LightningRL(credit="final", advantage="grpo", allow_empty=True).process(rollouts, spans)
            return AdapterRun(rollouts, spans, batch.transitions, batch.report)

        return asyncio.run(collect())

    # -- the contract ---------------------------------------------------------------------------

    def test_registered_as_a_plugin(self) -> None:

        assert self.adapter_name in default_plugins().adapters, (
            f"register the adapter with agentbolt_register_adapters under {self.adapter_name!r}"
        )
        adapter = default_plugins().adapters.get(self.adapter_name)()
        assert isinstance(adapter, Adapter)

    def test_transitions_get_exact_ids_and_agent_names(self, adapter: Adapter) -> None:
        run = self.run_dev()
        assert run.transitions, f"no transitions: {run.report.summary()}"
        for tr in run.transitions:
            assert tr.token_source is t.TokenSource.EXACT
            assert tr.prompt_ids and tr.response_ids
            assert tr.agent_name in self.agent_names, f"transition without a known agent name: {tr.agent_name!r}"
        calls = sum(len(run.gateway_spans(r.rollout_id)) for r in run.rollouts)
        assert len(run.transitions) == calls  # one transition per LLM call through the gateway
        if self.llm_calls_per_rollout is not None:
            assert all(len(run.gateway_spans(r.rollout_id)) == self.llm_calls_per_rollout for r in run.rollouts)

    def test_tree_is_rebuilt_from_framework_ids(self, adapter: Adapter) -> None:
        run = self.run_dev()
        for rollout in run.rollouts:
            own = run.adapter_spans(rollout.rollout_id)
            assert own, "the adapter recorded no spans"
            ids = {s.span_id for s in run.spans[rollout.rollout_id]}
            kinds = {s.attributes.get(semconv.SPAN_KIND_ATTR) for s in own}
            assert semconv.KIND_AGENT in kinds and semconv.KIND_LLM in kinds, kinds
            roots = [s for s in own if s.parent_span_id not in ids]
            assert len(roots) == self.roots_per_rollout, (
                f"expected {self.roots_per_rollout} root(s), got {[s.name for s in roots]}"
            )
            for root in roots:  # each framework run is one trace
                tree = {root.span_id}
                grew = True
                while grew:
                    new = {s.span_id for s in own if s.parent_span_id in tree} - tree
                    tree |= new
                    grew = bool(new)
                assert {s.trace_id for s in own if s.span_id in tree} == {root.trace_id}
            assert sum(1 for s in own if s.parent_span_id in ids or s in roots) == len(own)
            for s in own:
                assert s.attempt_id == rollout.current_attempt_id

    def test_llm_spans_join_the_gateway_spans(self, adapter: Adapter) -> None:
        """Each adapter LLM span joins a gateway span: by ``gen_ai.response.id``, or as its parent
        (the request carried the span as W3C ``traceparent``) — LightningRL's two exact joins."""
        run = self.run_dev()
        for rollout in run.rollouts:
            gateway = run.gateway_spans(rollout.rollout_id)
            response_ids = {s.attributes.get(semconv.GEN_AI_RESPONSE_ID) for s in gateway}
            parents = {s.parent_span_id for s in gateway}
            llm = [
                s
                for s in run.adapter_spans(rollout.rollout_id)
                if s.attributes.get(semconv.SPAN_KIND_ATTR) == semconv.KIND_LLM
            ]
            assert llm
            for s in llm:
                joined = s.attributes.get(semconv.GEN_AI_RESPONSE_ID) in response_ids or s.span_id in parents
                assert joined, s.attributes
                assert semconv.TOKEN_SOURCE not in s.attributes

    def test_concurrent_rollouts_do_not_mix(self, adapter: Adapter) -> None:
        tasks = list(self.tasks()) * 3
        run = self.run_dev(concurrency=8, tasks=tasks)
        seen: set[str] = set()
        for rollout in run.rollouts:
            response_ids = {s.attributes.get(semconv.GEN_AI_RESPONSE_ID) for s in run.gateway_spans(rollout.rollout_id)}
            for s in run.adapter_spans(rollout.rollout_id):
                rid = s.attributes.get(semconv.GEN_AI_RESPONSE_ID)
                if rid is not None:
                    assert rid in response_ids  # never another rollout's call
                    seen.add(rid)
        assert seen

    def test_instrument_and_uninstrument_are_idempotent(self) -> None:
        adapter = self.make_adapter()
        adapter.instrument()
        adapter.instrument()
        second = self.make_adapter()
        second.instrument()  # another instance must not double-record either
        try:
            once = self.run_dev(tasks=list(self.tasks())[:2])
        finally:
            second.uninstrument()
            adapter.uninstrument()
            adapter.uninstrument()
        keys = [(s.rollout_id, s.name, s.parent_span_id, s.start_time_ns) for s in once.adapter_spans()]
        assert len(keys) == len(set(keys)), "a unit was recorded twice"
        llm = [s for s in once.adapter_spans() if s.attributes.get(semconv.SPAN_KIND_ATTR) == semconv.KIND_LLM]
        calls = sum(len(once.gateway_spans(r.rollout_id)) for r in once.rollouts)
        assert len(llm) == calls
        after = self.run_dev(tasks=list(self.tasks())[:2])
        assert after.adapter_spans() == []
        assert all(after.gateway_spans(r.rollout_id) for r in after.rollouts)  # the gateway still records

    def test_never_raises_into_the_framework(self, adapter: Adapter, monkeypatch: pytest.MonkeyPatch) -> None:
        def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("recorder failure injected by the conformance suite")

        before = adapter.recorder.errors  # a recorder may be shared process-wide
        monkeypatch.setattr("agentbolt.capture.adapters.recorder._clean", broken)
        run = self.run_dev(tasks=list(self.tasks())[:2])
        assert all(r.status is t.RolloutStatus.SUCCEEDED for r in run.rollouts)
        assert adapter.recorder.errors > before

    def test_package_has_version_and_type_marker(self) -> None:

        package = type(self.make_adapter()).__module__.split(".")[0]
        module = importlib.import_module(package)
        assert isinstance(getattr(module, "__version__", None), str), f"{package} has no __version__"
        assert importlib.resources.files(package).joinpath("py.typed").is_file(), f"{package} ships no py.typed"

    def test_supported_versions_are_checked(self, monkeypatch: pytest.MonkeyPatch) -> None:
        adapter = self.make_adapter()
        assert adapter.distribution and adapter.supported, "declare distribution and supported versions"
        assert adapter.check_version()
        real = importlib.metadata.version
        monkeypatch.setattr(
            importlib.metadata, "version", lambda name: "0.0.1" if name == adapter.distribution else real(name)
        )
        with pytest.raises(UserError, match=adapter.supported.replace("*", r"\*")):
            adapter.instrument()
        assert not adapter.instrumented
