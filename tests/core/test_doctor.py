"""agentbolt doctor and the report Trainer.dev prints: every finding comes from a crafted run
(real gateway, runner and store against the fake backend) and is absent from a clean one; dev's
numbers are the store's, also when attempts time out or the upstream is dead."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

from openai import AsyncOpenAI
from typer.testing import CliRunner

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.algorithm import EvaluateResult
from agentbolt.cli import app
from agentbolt.options import CaptureOptions, RunnerOptions
from agentbolt.runs.doctor import DoctorReport, diagnose, doctor
from agentbolt.store import open_store
from agentbolt.store.memory import MemoryStore
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer, FakeTokenizer, Rule, ToolCall, ToolCalls
from agentbolt.trainer import Trainer

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
WEATHER = ToolCalls([ToolCall("get_weather", {"city": "Paris"})])


def backend(**kw: Any) -> FakeLLM:
    """A tool call for the user's question, then the answer once the tool result is in."""
    first_turn = Rule(match=lambda r: (r.messages or [{}])[-1].get("role") == "user", reply=WEATHER)
    return FakeLLM(rules=[first_turn], default_reply="It is sunny.", **kw)


def tool_agent(*, reformat_arguments: bool = False, name: str | None = "weather") -> Any:
    """Two calls: a tool call, then the answer. ``reformat_arguments`` sends the tool call back
    re-serialized (as frameworks do), which changes the history's tokens."""

    async def agent(task: dict[str, Any], resources: t.Resources) -> float:
        assert resources.llm is not None
        headers = {"X-Agentbolt-Agent-Name": name} if name else None
        messages: list[Any] = [{"role": "user", "content": task["question"]}]
        async with AsyncOpenAI(
            base_url=resources.llm.base_url, api_key="x", max_retries=0, default_headers=headers
        ) as client:
            first = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
            reply = first.choices[0].message.model_dump(exclude_none=True)
            if reformat_arguments:
                for call in reply["tool_calls"]:
                    call["function"]["arguments"] = json.dumps(json.loads(call["function"]["arguments"]), indent=1)
            messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "sunny"}]
            second = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        return 1.0 if second.choices[0].message.content else 0.0

    return agent


TASKS = [{"question": "weather in Paris?"}, {"question": "weather in Rome?"}]


def dev(
    agent: Any,
    llm: FakeLLM | str,
    *,
    n_samples: int = 2,
    runners: dict[str, Any] | None = None,
    capture: dict[str, Any] | None = None,
) -> tuple[EvaluateResult, MemoryStore]:
    store = MemoryStore()
    trainer = Trainer(
        agent,
        store=store,
        runners={"n": 0, **(runners or {})},
        capture={"adapters": [], **(capture or {})},
        progress=False,
    )
    if isinstance(llm, str):
        return trainer.dev(TASKS, llm=llm, model="m", n_samples=n_samples), store
    with FakeLLMServer(llm) as server:
        return trainer.dev(TASKS, llm=server.base_url, model="m", n_samples=n_samples), store


def stored(store: MemoryStore) -> DoctorReport:
    return asyncio.run(doctor(store))


def codes(report: DoctorReport) -> set[str]:
    return {f.code for f in report.findings}


def test_a_clean_run_has_no_findings_and_dev_says_capture_ok() -> None:
    result, store = dev(tool_agent(), backend())
    assert result.report is not None and result.report.findings == [], result.report.render()
    assert result.capture_ok()
    assert result.llm_calls == 8 and result.calls_with_exact_ids == 8
    assert result.lightningrl_calls == 8 and result.rollouts_unreconciled == 0 and result.unjoined_llm_spans == 0
    report = stored(store)
    assert report.findings == [] and report.counts.calls == 8 and report.counts.groups == 2
    assert result.report.counts.upstream_forwarded == 8  # the gateway's own count agrees


def test_missing_token_ids() -> None:
    result, _ = dev(tool_agent(), backend(token_ids=False))
    f = result.report.finding("missing_token_ids")
    assert f is not None and f.count == 8 and "retokenize" in f.fix
    assert not result.capture_ok()


class OtherTemplate(FakeTokenizer):
    def render_chat(self, messages: Any, tools: Any = None, *, add_generation_prompt: bool = True) -> list[int]:
        return super().render_chat([{"role": "system", "content": "Hi."}, *messages], tools)


def test_retokenized_and_drifted_calls() -> None:
    result, _ = dev(
        tool_agent(), backend(token_ids=False), capture={"token_ids": "retokenize", "tokenizer": FakeTokenizer()}
    )
    assert codes(result.report) == {"retokenized"} and result.report.ok
    result, _ = dev(
        tool_agent(), backend(token_ids=False), capture={"token_ids": "retokenize", "tokenizer": OtherTemplate()}
    )
    assert result.report.finding("token_drift").count == 8  # type: ignore[union-attr]
    assert "retokenized" not in codes(result.report)


def test_template_rewrite_when_history_is_re_serialized() -> None:
    result, _ = dev(tool_agent(reformat_arguments=True), backend())
    f = result.report.finding("template_rewrite")
    assert f is not None and f.count == 4  # the second call of each of the 4 rollouts


def test_unnamed_calls_and_singleton_groups() -> None:
    result, _ = dev(tool_agent(name=None), backend(), n_samples=1)
    assert codes(result.report) == {"unnamed_calls", "singleton_groups"}
    assert result.report.finding("singleton_groups").count == 2  # type: ignore[union-attr]
    assert "agent_names" in result.report.finding("unnamed_calls").fix  # type: ignore[union-attr]


def test_no_calls() -> None:
    async def lazy(task: Any, resources: t.Resources) -> float:
        return 1.0

    result, _ = dev(lazy, backend())
    assert result.report.finding("no_calls").count == 4  # type: ignore[union-attr]
    assert not result.capture_ok()


def test_failed_calls_are_not_missing_ids() -> None:
    from agentbolt.testing.fake_llm import Failure

    result, store = dev(
        tool_agent(), backend(failures=[Failure(kind="status", status=500)]), runners={"max_attempts": 1}
    )
    assert result.calls_missing_ids == 0
    assert result.calls_failed == result.llm_calls == 4  # each rollout's first call failed, then the agent raised
    f = result.report.finding("failed_calls")
    assert f is not None and "upstream_status_500 x4" in f.message
    assert stored(store).counts.calls_failed == 4


def test_dead_upstream_dev_counts_equal_the_store() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    result, store = dev(tool_agent(), dead, runners={"max_attempts": 2})
    report = stored(store)
    assert result.failed == 4
    assert result.llm_calls == report.counts.calls == report.counts.calls_failed == 8  # 4 rollouts x 2 attempts
    assert result.calls_missing_ids == 0 and result.report.finding("failed_calls").count == 8  # type: ignore[union-attr]
    assert report.counts.calls_in_ended_attempts == 8


def test_timed_out_attempts_dev_counts_equal_the_store() -> None:
    async def slow(task: Any, resources: t.Resources) -> float:
        assert resources.llm is not None
        async with AsyncOpenAI(base_url=resources.llm.base_url, api_key="x", max_retries=0) as client:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        await asyncio.sleep(60)
        return 1.0

    result, store = dev(slow, backend(), n_samples=1, runners={"timeout_s": 5.0, "max_attempts": 2})
    report = stored(store)
    assert result.succeeded == 0
    assert {r.error.type for r in (asyncio.run(store.query_rollouts(limit=10))).items} == {"timeout"}  # type: ignore[union-attr]
    # The calls made before each attempt timed out: one per attempt, unless a loaded machine took
    # the whole 5 s to get there. Whatever their number, dev and the store count the same.
    calls = report.counts.calls
    assert calls <= 2 and result.llm_calls == calls and result.calls_with_exact_ids == calls
    ended = result.report.finding("calls_in_ended_attempts")
    assert (ended.count if ended else 0) == calls


def test_calls_forwarded_but_not_in_the_store() -> None:
    """The gateway's counters against the store: a span lost on the way (dropped here) is reported."""
    _, store = dev(tool_agent(), backend())

    async def spans_but_one() -> DoctorReport:
        rollouts = (await store.query_rollouts(limit=100)).items
        spans = await store.query_spans([r.rollout_id for r in rollouts])
        first = rollouts[0].rollout_id
        lost = next(s for s in spans[first] if semconv.TOKEN_SOURCE in s.attributes)
        spans[first] = [s for s in spans[first] if s is not lost]
        return diagnose(rollouts, spans, gateway_stats={"forwarded": 8, "spans_dropped": 1})

    report = asyncio.run(spans_but_one())
    f = report.finding("not_recorded")
    assert f is not None and f.count == 1 and "1 dropped" in f.message


def test_cli_doctor_reads_a_store_and_exits_1_when_not_ok(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    with FakeLLMServer(backend(token_ids=False)) as server:
        Trainer(
            tool_agent(),
            store=url,
            runners=RunnerOptions(n=0),
            capture=CaptureOptions(adapters=[]),
            progress=False,
        ).dev(TASKS, llm=server.base_url, model="m", n_samples=2)
    out = CliRunner().invoke(app, ["doctor", "--store", url])
    assert out.exit_code == 1, out.output
    assert "ERROR missing_token_ids (8)" in out.output and "Fix: use a backend that returns token ids" in out.output
    out = CliRunner().invoke(app, ["doctor", "--store", url, "--run", "no-such-run", "--json"])
    assert out.exit_code == 1 and "no rollouts of run 'no-such-run'" in out.stderr  # not an empty report
    store = open_store(url)
    asyncio.run(store.close())


def bypassing_agent(direct_url: str) -> Any:
    """One call through the gateway, and one, traced by the agent's own GenAI instrumentation, to
    a fixed URL (the backend itself): a model call the gateway never sees."""
    from opentelemetry import trace

    async def agent(task: dict[str, Any], resources: t.Resources) -> float:
        assert resources.llm is not None
        messages: list[Any] = [{"role": "user", "content": task["question"]}]
        tracer = trace.get_tracer("my-genai-instrumentation")
        async with AsyncOpenAI(base_url=resources.llm.base_url, api_key="x", max_retries=0) as client:
            await client.chat.completions.create(model="m", messages=messages)
        with tracer.start_as_current_span("chat m", attributes={semconv.GEN_AI_OPERATION_NAME: "chat"}) as span:
            async with AsyncOpenAI(base_url=direct_url, api_key="x", max_retries=0) as client:
                direct = await client.chat.completions.create(model="m", messages=messages)
            span.set_attribute(semconv.GEN_AI_RESPONSE_ID, direct.id)
        return 1.0

    return agent


def test_a_call_that_bypasses_the_gateway_flags_the_rollout() -> None:
    with FakeLLMServer(backend()) as direct:
        result, store = dev(bypassing_agent(direct.base_url), backend(), n_samples=1)
    assert result.report is not None
    finding = result.report.finding("unreconciled")
    assert finding is not None and finding.severity == "error" and finding.count == 2
    assert "resources.llm.base_url" in finding.fix and not result.capture_ok()
    assert result.rollouts_unreconciled == 2 and result.lightningrl_calls == result.llm_calls == 2
    assert "reconciliation (final attempts): 2 gateway calls, 2 LightningRL calls" in result.report.render()
    counts = stored(store).counts
    assert set(counts.unreconciled_rollouts) == set(counts.reconciliation) and counts.unjoined_llm_spans == 2


def test_dev_prints_the_report_and_a_summary_without_repeated_rows(capsys: Any) -> None:
    with FakeLLMServer(backend(token_ids=False)) as server:
        trainer = Trainer(
            tool_agent(),
            store=MemoryStore(),
            runners=RunnerOptions(n=0),
            capture=CaptureOptions(adapters=[]),
            progress=True,
        )
        trainer.console.width = 200
        trainer.dev(TASKS, llm=server.base_url, model="m", n_samples=2)
    err = capsys.readouterr().err
    assert "capture NOT ok: 8 LLM calls in the store: 0 with exact token ids, 0 retokenized, 8 missing" in err
    assert "ERROR missing_token_ids (8)" in err and "Fix: use a backend that returns token ids" in err
    rows = [line.strip("│ ").split()[0:2] for line in err.splitlines() if line.startswith("│")]
    labels = [" ".join(r) for r in rows]
    assert labels.count("rollouts succeeded") == 1
    assert not any(
        label.startswith(("succeeded", "failed", "rollouts ")) and label != "rollouts succeeded" for label in labels
    )
    assert any("seconds running rollouts" in line for line in err.splitlines())


def test_the_summary_counts_only_its_own_runs_rollouts(capsys: Any) -> None:
    """Two runs in one store: the second run's summary counts its rollouts, not the store's."""
    store = MemoryStore()
    succeeded = []
    with FakeLLMServer(backend(token_ids=False)) as server:
        for _ in range(2):
            trainer = Trainer(
                tool_agent(),
                store=store,
                runners=RunnerOptions(n=0),
                capture=CaptureOptions(adapters=[]),
                progress=True,
            )
            trainer.console.width = 200
            trainer.dev(TASKS, llm=server.base_url, model="m", n_samples=2)
            rows = [line.strip("│ ").split() for line in capsys.readouterr().err.splitlines() if line.startswith("│")]
            succeeded += [int(r[-1]) for r in rows if r[:2] == ["rollouts", "succeeded"]]
    assert succeeded == [len(TASKS) * 2] * 2


def test_a_rollout_naming_a_run_without_a_record_is_diagnosed() -> None:
    """Rollouts enqueued by hand may name a run the store has no record of: the doctor skips
    that run's recorded metrics (NotFoundError) and still reports the rollouts."""

    async def run() -> DoctorReport:
        store = MemoryStore()
        await store.enqueue([t.RolloutSpec(input={"q": 1}, run_id="no-record")])
        return await doctor(store)

    report = asyncio.run(run())
    assert report.counts.rollouts == 1 and report.finding("quarantined") is None
