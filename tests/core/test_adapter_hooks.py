"""The adapter skeleton in core: one set of hooks per adapter class and process, installed by the
first instrumented instance and removed by the last, never raising into the framework, and a
failed instrumentation reported (what runners record for ``agentbolt dev`` / ``doctor``).

The "framework" here is a small class of this module whose method the hooks wrap, the way the
AutoGen and Agents SDK adapters wrap one framework method each."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, ClassVar

import pytest

from agentbolt import hookimpl, semconv
from agentbolt.capture.adapters import (
    Adapter,
    AdapterHooks,
    UnitRecord,
    instrument_adapters,
    never_raises,
    unix_ns,
)
from agentbolt.capture.tracing import RolloutContext, rollout_context
from agentbolt.errors import UserError
from agentbolt.plugins import Plugins


class Framework:
    """Stands for a host framework: ``run`` is what the hooks wrap."""

    def run(self, task: str) -> str:
        return f"done {task}"


class ListSink:
    def __init__(self) -> None:
        self.spans: list[Any] = []

    def put(self, span: Any) -> None:
        self.spans.append(span)


class ToyHooks(AdapterHooks):
    fail_install: ClassVar[bool] = False

    def __init__(self, adapter: str) -> None:
        super().__init__(adapter)
        self.installs = 0
        self.uninstalls = 0

    def install(self) -> None:
        self.installs += 1
        self.patch(Framework, "run", self._wrap)
        if self.fail_install:
            raise RuntimeError("the framework refused the hook")

    def uninstall(self) -> None:
        self.uninstalls += 1

    def _wrap(self, original: Any) -> Any:
        hooks = self

        def run(framework: Framework, task: str) -> str:
            if hooks.active:
                hooks.on_run(task)
            return original(framework, task)  # type: ignore[no-any-return]

        return run

    @never_raises("on_run")
    def on_run(self, task: str) -> None:
        if task == "boom":
            raise ValueError("translation bug")
        self.recorder.start(task, UnitRecord(semconv.KIND_AGENT, f"invoke_agent {task}"))
        self.recorder.end(task)


class ToyAdapter(Adapter):
    name: ClassVar[str] = "toy"
    distribution: ClassVar[str] = "agentbolt"
    supported: ClassVar[str] = ">=0"

    @classmethod
    def make_hooks(cls) -> ToyHooks:
        return ToyHooks(cls.name)


_original_run = Framework.__dict__["run"]


@pytest.fixture(autouse=True)
def fresh_hooks() -> Iterator[None]:
    """Each test starts with no hooks built (as in a new process) and leaves none installed."""
    ToyHooks.fail_install = False
    yield
    hooks = ToyAdapter.__dict__.get("_shared_hooks")
    if hooks is not None:
        for owner in list(hooks._owners):
            owner.uninstrument()
        del ToyAdapter._shared_hooks
    Framework.run = _original_run  # type: ignore[method-assign]


def run_in_rollout(task: str) -> list[Any]:
    sink = ListSink()
    with rollout_context(RolloutContext("r1", "a1", sink)):
        assert Framework().run(task) == f"done {task}"
    return sink.spans


def test_instances_share_one_install_and_the_last_one_out_uninstalls() -> None:
    first, second = ToyAdapter(), ToyAdapter()
    first.instrument()
    first.instrument()
    second.instrument()
    hooks = ToyAdapter.shared_hooks()
    assert first.hooks is second.hooks is hooks and first.recorder is hooks.recorder
    assert hooks.installs == 1 and hooks.owner is first
    assert [s.name for s in run_in_rollout("t")] == ["invoke_agent t"]  # recorded once, not per instance
    first.uninstrument()
    assert hooks.active and hooks.uninstalls == 0 and hooks.owner is second
    second.uninstrument()
    second.uninstrument()
    assert not hooks.active and hooks.uninstalls == 1 and hooks.owner is None
    assert "run" in Framework.__dict__ and not hasattr(Framework.run, "__agentbolt_hooks__")  # patch undone
    assert run_in_rollout("t") == []


def test_a_patch_wrapped_by_someone_else_is_left_in_place_and_not_doubled() -> None:
    adapter = ToyAdapter()
    adapter.instrument()
    ours = Framework.__dict__["run"]

    def theirs(framework: Framework, task: str) -> str:
        return ours(framework, task)  # type: ignore[no-any-return]

    theirs.__agentbolt_hooks__ = ours.__agentbolt_hooks__  # what functools.wraps copies
    Framework.run = theirs  # type: ignore[method-assign]
    try:
        adapter.uninstrument()
        assert Framework.__dict__["run"] is theirs  # not pulled from under the other wrapper
        assert run_in_rollout("t") == []  # ours passes through while inactive
        adapter.instrument()
        assert Framework.__dict__["run"] is theirs  # ours is still in the chain: not wrapped twice
        assert [s.name for s in run_in_rollout("t")] == ["invoke_agent t"]
    finally:
        adapter.uninstrument()


def test_errors_in_translation_never_reach_the_framework_and_are_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    adapter = ToyAdapter()
    adapter.instrument()
    errors = adapter.recorder.errors
    with caplog.at_level(logging.WARNING, logger="agentbolt.capture.adapters"):
        assert run_in_rollout("boom") == []
        assert run_in_rollout("boom") == []
    assert adapter.recorder.errors == errors + 2
    assert len([r for r in caplog.records if "on_run failed" in r.getMessage()]) == 1


def test_a_failed_install_leaves_nothing_installed_and_is_reported() -> None:
    ToyHooks.fail_install = True
    adapter = ToyAdapter()
    with pytest.raises(RuntimeError, match="refused"):
        adapter.instrument()
    hooks = ToyAdapter.shared_hooks()
    assert not adapter.instrumented and not hooks.active and hooks.owner is None
    assert Framework.__dict__["run"] is _original_run  # the patch made before the failure is undone

    plugins = Plugins(load_entry_points=False)

    class ToyPlugin:
        @hookimpl
        def agentbolt_register_adapters(self, register: Any) -> None:
            register("toy", ToyAdapter)

    plugins.register(ToyPlugin(), name="toy-plugin")
    failures: list[str] = []
    assert instrument_adapters(plugins=plugins, failures=failures) == []
    assert failures == ["toy: the framework refused the hook"]  # what runners record for agentbolt doctor


def test_unsupported_framework_versions_are_refused_before_installing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ToyAdapter, "supported", ">=999")
    adapter = ToyAdapter()
    with pytest.raises(UserError, match=r"supports agentbolt>=999"):
        adapter.instrument()
    assert ToyAdapter.shared_hooks().installs == 0


def test_capture_warnings_are_warned_each_time_logged_once_and_never_raise(caplog: pytest.LogCaptureFixture) -> None:
    hooks = ToyAdapter.shared_hooks()
    with pytest.warns(UserWarning, match="cannot see"):
        hooks.warn("kind", "the adapter cannot see X: do Y")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hooks.warn("kind", "the adapter cannot see X: do Y")  # turned into an error: still not raised
    assert len([r for r in caplog.records if "cannot see" in r.getMessage()]) == 1


def test_unix_ns_reads_the_timestamps_frameworks_report() -> None:
    moment = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    expected = int(moment.timestamp() * 1_000_000) * 1000
    assert unix_ns(moment) == unix_ns(moment.isoformat()) == expected
    assert abs(unix_ns(moment.timestamp()) - expected) < 1000  # float seconds: within a microsecond
    assert unix_ns(None) == unix_ns("not a time") == 0


class DeclaredHooksAdapter(Adapter):
    """Names its hooks class instead of overriding make_hooks (what the adapter packages do)."""

    name: ClassVar[str] = "declared"
    distribution: ClassVar[str] = "agentbolt"
    supported: ClassVar[str] = ">=0"
    hooks_class: ClassVar[str] = f"{__name__}:ToyHooks"


def test_hooks_class_is_imported_and_built_with_the_adapter_name() -> None:
    hooks = DeclaredHooksAdapter.make_hooks()
    assert type(hooks) is ToyHooks
    assert hooks.adapter == "declared"


def test_an_adapter_without_hooks_says_what_to_set() -> None:
    class NoHooks(Adapter):
        name: ClassVar[str] = "no-hooks"

    with pytest.raises(TypeError, match=r"NoHooks must set hooks_class \('module:Class'\) or override make_hooks"):
        NoHooks.make_hooks()
