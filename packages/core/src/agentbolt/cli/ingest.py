"""``agentbolt ingest``: OTLP traces of a deployed, instrumented agent become rollouts of a named run.

agentbolt ingest --run support-bot --store sqlite:///traces.db --tokenizer HuggingFaceTB/SmolLM2-135M-Instruct
agentbolt ingest --run support-bot --group-by session.id --scorer my_app.rewards:score

A command of its own rather than a mode of ``agentbolt serve``: ``serve`` sits in the path of live
calls (its gateway answers them); ``ingest`` never sees a call, only the telemetry the agent
already exports, so it runs beside any deployment without changing where the agent's model calls
go. It listens for OTLP/HTTP (``--port``, 4318) and OTLP/gRPC (``--grpc-port``, 4317) on
127.0.0.1, prints a line per trace as it opens, completes and gets a reward, and a table on
exit. The Python equivalent is :class:`agentbolt.traces.TraceIngestor`; docs/traces.md is the guide.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import Annotated, Any

import typer

from ..errors import AgentboltError, UserError
from .tables import Column, show, table

__all__ = ["register", "status_line"]


def status_line(row: dict[str, Any]) -> str:
    """One trace's status as the command prints it."""
    excluded = row["excluded"]
    calls = f"{row['llm_calls']} LLM calls ({row['retokenized']} retokenized"
    if excluded:
        calls += ", excluded: " + ", ".join(f"{n} {why}" for why, n in sorted(excluded.items()))
    calls += ")"
    parts = [f"{row['traces']} trace(s)" if row["group"] == "session" else None, f"{row['spans']} spans", calls]
    parts.append(f"{row['tool_calls']} tool calls")
    if row["agents"]:
        parts.append("agents " + ", ".join(row["agents"]))
    if row["duplicates"]:
        parts.append(f"{row['duplicates']} resent")
    if row["late"]:
        parts.append(f"{row['late']} late")
    reward = "no reward" if row["reward"] is None else f"reward {row['reward']:g} ({row['reward_source']})"
    parts.append(reward)
    if row["note"]:
        parts.append(row["note"])
    return f"{row['group']} {row['key']} {row['state']}: " + ", ".join(p for p in parts if p)


def ingest_command(
    run: Annotated[str, typer.Option("--run", "-r", help="Name of the run the traced rollouts belong to.")],
    store: Annotated[
        str, typer.Option("--store", "-s", help="Store for the rollouts (sqlite:///..., postgresql://..., http://...).")
    ] = "sqlite:///agentbolt-traces.db",
    tokenizer: Annotated[
        str | None,
        typer.Option(
            help="The policy's tokenizer (Hugging Face name or path) to rebuild token ids; without it every "
            "call is stored with its messages but no ids (excluded from RL, usable for SFT after retokenizing)."
        ),
    ] = None,
    group_by: Annotated[
        str | None,
        typer.Option(help="Span attribute naming a session (session.id...): one rollout per session, not per trace."),
    ] = None,
    quiet: Annotated[
        float, typer.Option(help="Seconds without a new span, after the root span arrived, before a trace completes.")
    ] = 10.0,
    max_open: Annotated[
        float, typer.Option(help="Seconds after which a trace whose root never arrived completes.")
    ] = 600.0,
    scorer: Annotated[
        str | None, typer.Option(help="module:name of a scoring function (TracedRollout -> reward or None).")
    ] = None,
    judge_url: Annotated[
        str | None, typer.Option(help="OpenAI-compatible base URL of a judge for completed traces.")
    ] = None,
    judge_model: Annotated[str | None, typer.Option(help="The judge's model name.")] = None,
    judge_key: Annotated[
        str | None, typer.Option(envvar="AGENTBOLT_JUDGE_API_KEY", show_envvar=True, help="API key of the judge.")
    ] = None,
    adapters: Annotated[
        str | None, typer.Option(help="Comma-separated adapters that translate spans (default: every installed one).")
    ] = None,
    host: Annotated[
        str, typer.Option(help="Address to listen on (loopback only: OTLP has no authentication here).")
    ] = ("127.0.0.1"),
    port: Annotated[int, typer.Option(help="OTLP/HTTP port (also feedback and status; 0 picks a free one).")] = 4318,
    grpc_port: Annotated[int, typer.Option(help="OTLP/gRPC port (0 picks a free one).")] = 4317,
    grpc: Annotated[bool, typer.Option("--grpc/--no-grpc", help="Receive OTLP/gRPC (needs agentbolt[grpc]).")] = True,
    complete_on_exit: Annotated[
        bool, typer.Option(help="On exit, complete open traces now instead of leaving them for the next start.")
    ] = False,
) -> None:
    """Receive OTLP traces of a deployed agent (OpenInference, OpenLLMetry, AgentOps) and store them as
    rollouts of RUN: POST /v1/traces (OTLP/HTTP), OTLP/gRPC, POST /v1/feedback, GET /v1/traces/status."""
    try:
        asyncio.run(
            _ingest(
                run=run,
                store=store,
                tokenizer=tokenizer,
                group_by=group_by,
                quiet=quiet,
                max_open=max_open,
                scorer=scorer,
                judge=(judge_url, judge_model, judge_key),
                adapters=adapters,
                host=host,
                port=port,
                grpc_port=grpc_port if grpc else None,
                complete_on_exit=complete_on_exit,
            )
        )
    except (AgentboltError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None


async def _ingest(
    *,
    run: str,
    store: str,
    tokenizer: str | None,
    group_by: str | None,
    quiet: float,
    max_open: float,
    scorer: str | None,
    judge: tuple[str | None, str | None, str | None],
    adapters: str | None,
    host: str,
    port: int,
    grpc_port: int | None,
    complete_on_exit: bool,
) -> None:
    from ..runners.runner import import_reference
    from ..store import open_store
    from ..store.server.run import is_loopback
    from ..traces import IngestOptions, IngestServer, SpanTranslation, TraceIngestor
    from ..traces.ingest import status_row
    from ..traces.translation import otel_span_hooks

    if not is_loopback(host):
        raise UserError(
            f"refusing to listen on {host!r}: agentbolt ingest has no authentication; bind to 127.0.0.1 and "
            "forward from an OpenTelemetry Collector if agents run on other machines"
        )
    judge_url, judge_model, judge_key = judge
    llm_judge = None
    if judge_url is not None or judge_model is not None:
        if judge_url is None or judge_model is None:
            raise UserError("--judge-url and --judge-model go together")
        from ..rewards import LLMJudge

        llm_judge = LLMJudge(judge_url, judge_model, api_key=judge_key)
    names = [a.strip() for a in adapters.split(",") if a.strip()] if adapters else None
    translation = SpanTranslation(tokenizer, hooks=otel_span_hooks(names=names))
    if not translation.hooks:
        typer.echo("warning: no instrumentation adapter is installed: spans are stored untranslated", err=True)
    opened = open_store(store)
    ingestor = TraceIngestor(
        opened,
        run,
        translation=translation,
        options=IngestOptions(group_by=group_by, quiet_s=quiet, max_open_s=max_open),
        scorer=import_reference(scorer, "--scorer") if scorer is not None else None,
        judge=llm_judge,
    )
    seen: dict[str, str] = {}

    def on_change(state: Any) -> None:
        line = status_line(status_row(state))
        if seen.get(state.rollout_id) != line:
            seen[state.rollout_id] = line
            typer.echo(line)

    ingestor.on_change = on_change
    server = IngestServer(ingestor, host=host, http_port=port, grpc_port=grpc_port)
    await server.start()
    where = f"OTLP/HTTP on {server.http_url}/v1/traces"
    if server.grpc_endpoint is not None:
        where += f", OTLP/gRPC on {server.grpc_endpoint}"
    adapters_text = ", ".join(translation.adapters) or "none"
    typer.echo(
        f"ingesting run {run!r} into {opened.url}: {where}; feedback: POST {server.http_url}/v1/feedback "
        f"(adapters: {adapters_text}; tokenizer: {tokenizer or 'none'})",
        err=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        if complete_on_exit:
            await ingestor.complete_all()
        await server.stop()
        await opened.close()
        _summary(ingestor.status())


def _summary(rows: list[dict[str, Any]]) -> None:
    if not rows:
        typer.echo("no traces received", err=True)
        return
    columns = [
        Column("rollout", ident=True),
        Column("state"),
        Column("spans", number=True),
        Column("calls", number=True),
        Column("retokenized", number=True),
        Column("excluded", number=True),
        Column("reward", number=True),
    ]
    cells = [
        [
            str(r["rollout_id"]),
            str(r["state"]),
            str(r["spans"]),
            str(r["llm_calls"]),
            str(r["retokenized"]),
            str(sum(r["excluded"].values())),
            "-" if r["reward"] is None else f"{r['reward']:g}",
        ]
        for r in rows
    ]
    show(table(f"{len(rows)} traced rollouts", columns, cells, keep=["reward"]))


def register(app: typer.Typer) -> None:
    """Add ``agentbolt ingest`` to the command line."""
    app.command("ingest")(ingest_command)
