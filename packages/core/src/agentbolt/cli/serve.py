"""``agentbolt serve``: live clients through the gateway, sessions, feedback, judge, background training.

agentbolt serve --upstream http://127.0.0.1:8000/v1 --store sqlite:///serve.db --token $TOKEN
agentbolt serve --policy agentbolt_torch.training.online:smollm2 --gate my_app.serving:gate --judge-url ... --judge-model ...

``--upstream`` records sessions and feedback in front of any OpenAI-compatible server (nothing is
trained here: train elsewhere from the store); ``--policy`` names an
:class:`~agentbolt.online.OnlinePolicy` (or a function returning one) that the server trains in the
background: agentbolt-torch's ready-made ones are ``agentbolt_torch.training.online:smollm2`` (full
fine-tuning), ``:smollm2_lora`` and ``:tiny``; a function of your own returning a
``TorchOnlinePolicy(...)`` sets the rest. The Python equivalent is
:class:`agentbolt.online.OnlineServer`; docs/online.md is the guide.
"""

from __future__ import annotations

import inspect
import logging
from typing import Annotated, Any

import typer

from ..errors import StoreUnavailableError, UserError

__all__ = ["register"]


def load_reference(reference: str, what: str) -> Any:
    """The object a ``module:name`` reference names (a function or class is called without arguments)."""
    from ..runners.runner import import_reference  # the CLI loads what a command runs in its body

    obj = import_reference(reference, what)
    return obj() if inspect.isfunction(obj) or inspect.isclass(obj) else obj


def serve_command(
    upstream: Annotated[
        str | None,
        typer.Option("--upstream", "-u", help="OpenAI-compatible base URL (with /v1) to serve as is (no training)."),
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(
            help="module:name of an OnlinePolicy (or a function returning one) that is served and trained in the "
            "background, e.g. agentbolt_torch.training.online:smollm2 (or :smollm2_lora, :tiny) with agentbolt-torch installed."
        ),
    ] = None,
    store: Annotated[
        str, typer.Option("--store", "-s", help="Durable store for sessions, calls and rewards.")
    ] = "sqlite:///agentbolt-serve.db",
    state_dir: Annotated[
        str, typer.Option(help="The serve ledger and live checkpoints (keep it with the store).")
    ] = "agentbolt-serve",
    host: Annotated[
        str, typer.Option(help="Address to listen on; anything but loopback requires --token.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 4900,
    token: Annotated[
        str | None,
        typer.Option(envvar="AGENTBOLT_SERVE_TOKEN", show_envvar=True, help="Bearer token clients send as api_key."),
    ] = None,
    upstream_key: Annotated[
        str | None,
        typer.Option(envvar="AGENTBOLT_UPSTREAM_API_KEY", show_envvar=True, help="API key sent to --upstream."),
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model name forced into every request (--upstream).")] = None,
    idle: Annotated[float, typer.Option(help="Seconds without a call after which a session closes.")] = 300.0,
    min_sessions: Annotated[int, typer.Option(help="Rewarded sessions that start an update (--policy).")] = 32,
    grouping: Annotated[
        str, typer.Option(help="How sessions form advantage groups: auto, task_key, prompt or batch.")
    ] = "auto",
    gate: Annotated[
        str | None, typer.Option(help="module:name of GateOptions (or a mapping / a function returning one).")
    ] = None,
    judge_url: Annotated[
        str | None, typer.Option(help="OpenAI-compatible base URL of a judge for sessions nobody rated.")
    ] = None,
    judge_model: Annotated[str | None, typer.Option(help="The judge's model name.")] = None,
    judge_key: Annotated[
        str | None, typer.Option(envvar="AGENTBOLT_JUDGE_API_KEY", show_envvar=True, help="API key of the judge.")
    ] = None,
    judge_after: Annotated[
        float, typer.Option(help="Seconds after a session closes without feedback before the judge scores it.")
    ] = 3600.0,
    judge_mode: Annotated[str, typer.Option(help="rubric (each alone) or ranking (a group together).")] = "rubric",
) -> None:
    """Serve live clients (Chat Completions, Responses, Messages, streaming) at http://HOST:PORT/v1,
    record every call into sessions, take POST /v1/feedback, judge unrated sessions and train in
    the background."""
    from ..gateway import Upstream
    from ..online import JudgeOptions, OnlineServer, SessionOptions, StaticPolicy, UpdateOptions, serve
    from ..rewards import LLMJudge

    try:
        if (upstream is None) == (policy is None):
            raise UserError(
                "give exactly one of --upstream URL (serve as is) or --policy module:name (serve and train)"
            )
        served = (
            StaticPolicy(Upstream(upstream, api_key=upstream_key), model)
            if upstream is not None
            else load_reference(str(policy), "--policy")
        )
        judge = None
        if judge_url is not None or judge_model is not None:
            if judge_url is None or judge_model is None:
                raise UserError("--judge-url and --judge-model go together")
            judge = JudgeOptions(
                judge=LLMJudge(judge_url, judge_model, api_key=judge_key), after_s=judge_after, mode=judge_mode
            )
        server = OnlineServer(
            store,
            served,
            state_dir=state_dir,
            host=host,
            port=port,
            token=token,
            sessions=SessionOptions(idle_s=idle),
            updates=UpdateOptions(min_sessions=min_sessions, grouping=grouping),
            gate=load_reference(gate, "--gate") if gate is not None else None,
            judge=judge,
        )
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        serve(server)
    except (UserError, StoreUnavailableError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None


def register(app: typer.Typer) -> None:
    """Add ``agentbolt serve`` to the command line."""
    app.command("serve")(serve_command)
