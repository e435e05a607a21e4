"""The dashboard as an ASGI app: server-rendered pages (Starlette + Jinja2) over any store.

Pages: ``/runs`` (live; compare runs' curves), ``/runs/{id}`` (a run's curves and steps, live,
and its training health: :mod:`agentbolt.runs.health`),
``/runs/{id}/rewards`` (reward debugger), ``/runs/{id}/compare?a=&b=&filter=`` (two evaluations on
the same held-out questions: :mod:`agentbolt.runs.checkpoint_compare`), ``/rollouts`` (filterable, paginated),
``/rollouts/{id}`` (trajectory replay), ``/health``, ``/serve`` and ``/runs/{id}/serving`` (an
``agentbolt serve`` run: sessions, feedback, judge, versions and the gate's decisions;
:mod:`agentbolt_dashboard.serving`). JSON for the live parts: ``/api/runs``,
``/api/runs/{id}/metrics?after_seq=``, ``/api/runs/{id}/compare?a=&b=`` and ``/api/runs/{id}/serving``. Charts are uPlot, vendored under ``static/vendor`` (MIT,
licence beside it); nothing is fetched from elsewhere.

Read-only: anything but GET/HEAD answers 405. With a token, every request must carry it
(``Authorization: Bearer``, or ``?token=`` once, which sets a cookie).
"""

from __future__ import annotations

import hmac
import logging
import math
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from agentbolt import __version__
from agentbolt import types as t
from agentbolt.errors import NotFoundError, UserError
from agentbolt.runs import checkpoint_compare, reward_view, views
from agentbolt.runs.health import run_health
from agentbolt.runs.summary import LAST_K, RunSummary, run_summary
from agentbolt.store import RolloutSearch, Run
from agentbolt.store.base import Store

from . import charts, serving

__all__ = ["TOKEN_COOKIE", "create_app"]

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
TOKEN_COOKIE = "agentbolt_dashboard_token"
PAGE_SIZE = 50
FIDELITY_SAMPLE = 50
"""The Health page counts captured-call fidelity over this many latest succeeded rollouts."""
FINDINGS_RUNS = 20
"""The Runs page checks the training health (findings) of this many newest runs."""


def _fmt_time(ts: float | None) -> str:
    return "" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _fmt_num(value: Any, digits: int = 4) -> str:
    if value is None:
        return "\u2013"  # en dash
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.{digits}g}"
    return str(value)


def _duration(a: float | None, b: float | None) -> str:
    if a is None:
        return ""
    seconds = (b or time.time()) - a
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _ago(ts: float | None) -> str:
    """``ts`` as an age: ``12 s ago``, ``3.5 min ago``, ``2.0 h ago``, ``4.1 d ago``."""
    if ts is None:
        return "\u2013"
    seconds = max(0.0, time.time() - ts)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min ago"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h ago"
    return f"{seconds / 86400:.1f} d ago"


def _percent(value: float | None) -> str:
    return "\u2013" if value is None else f"{100 * value:.0f}%"


def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]))
    env.filters["time"] = _fmt_time
    env.filters["num"] = _fmt_num
    env.filters["ago"] = _ago
    env.filters["percent"] = _percent
    env.globals["duration"] = _duration
    env.globals["version"] = __version__
    return env


class _Guard:
    """Read-only and (optionally) token-protected."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        if request.method not in ("GET", "HEAD"):
            await PlainError(405, "the dashboard is read-only")(scope, receive, send)
            return
        if self.token is not None and not request.url.path.startswith("/static/"):
            given = request.query_params.get("token")
            if given is not None and hmac.compare_digest(given, self.token):
                target = request.url.remove_query_params("token")
                response = RedirectResponse(str(target.path) + (f"?{target.query}" if target.query else ""), 303)
                response.set_cookie(TOKEN_COOKIE, self.token, httponly=True, samesite="strict")
                await response(scope, receive, send)
                return
            header = request.headers.get("authorization", "")
            offered = header[7:] if header.lower().startswith("bearer ") else request.cookies.get(TOKEN_COOKIE, "")
            if not hmac.compare_digest(offered, self.token):
                await PlainError(401, "open the dashboard with ?token=<token> (the token it was started with)")(
                    scope, receive, send
                )
                return
        await self.app(scope, receive, send)


class PlainError(Response):
    """A small HTML error page."""

    def __init__(self, status: int, message: str) -> None:
        body = f"<!doctype html><title>{status}</title><h1>{status}</h1><p>{message}</p>"
        super().__init__(body, status_code=status, media_type="text/html")


def create_app(store: Store, *, token: str | None = None, store_label: str | None = None) -> Starlette:
    """The dashboard for ``store`` (read-only; closing the store is the caller's business)."""
    env = _environment()
    label = store_label or store.url

    def page(name: str, request: Request, status: int = 200, **context: Any) -> HTMLResponse:
        html = env.get_template(name).render(request=request, store_url=label, **context)
        return HTMLResponse(html, status_code=status)

    async def not_found(request: Request, exc: Exception) -> Response:
        detail = exc.detail if isinstance(exc, HTTPException) else str(exc)
        return page("404.html", request, status=404, message=detail)

    async def bad_request(request: Request, exc: Exception) -> Response:
        return page("404.html", request, status=400, message=str(exc), title="Bad request")

    async def index(request: Request) -> Response:
        return RedirectResponse("/runs", 307)

    finished_cards: dict[str, tuple[tuple[Any, ...], RunSummary]] = {}
    """Summary cards of finished runs whose rollouts have all finished, by run id: what they read
    (held-out rollouts, metrics, the spans behind the findings) no longer changes, so the Runs page
    computes each once, not per request."""

    async def card_of(run: Run, *, findings: bool) -> RunSummary:
        key = (run.status, run.ended_at, run.steps, findings)  # a resumed run is running again: recomputed
        cached = finished_cards.get(run.run_id)
        if cached is not None and cached[0] == key:
            return cached[1]
        card = await run_summary(store, run.run_id, findings=findings)
        if run.status.is_final:
            unfinished = [t.RolloutStatus.QUEUED, t.RolloutStatus.RUNNING]  # may still finish, and count
            if not (await store.search_rollouts(RolloutSearch(run_id=run.run_id, status=unfinished, limit=1))).total:
                finished_cards[run.run_id] = (key, card)
        return card

    async def runs_page(request: Request) -> Response:
        runs = await store.list_runs(limit=200)
        latest: dict[str, float] = {}
        for run in runs:
            latest.update(run.latest)
        policies = {run.run_id: views.run_policies(run.config) for run in runs}
        every = sorted({name for names in policies.values() for name in names})
        metrics = views.metric_names(latest, every)
        cards = {  # findings (they read spans) for the newest runs only
            run.run_id: await card_of(run, findings=i < FINDINGS_RUNS) for i, run in enumerate(runs)
        }
        for gone in finished_cards.keys() - cards.keys():  # only the listed runs' cards are kept
            del finished_cards[gone]
        return page(
            "runs.html",
            request,
            runs=runs,
            cards=cards,
            last_k=LAST_K,
            findings_runs=FINDINGS_RUNS,
            metrics=metrics,
            policies=policies,
            nav="runs",
        )

    async def run_page(request: Request) -> Response:
        run = await store.get_run(request.path_params["run_id"])
        policies = views.run_policies(run.config)
        health = await run_health(store, run.run_id)
        card = await run_summary(store, run.run_id, findings=False)
        card.findings = health.findings
        groups = charts.chart_groups(run.latest, policies, card)
        return page(
            "run.html",
            request,
            run=run,
            card=card,
            groups=groups,
            default_charts=charts.default_charts(groups),
            heldout=charts.heldout_series(card),
            metrics=views.metric_names(run.latest, policies),
            policies={run.run_id: policies},
            rollouts=card.rollouts,
            health=health,
            last_k=LAST_K,
            nav="runs",
        )

    async def api_summary(request: Request) -> Response:
        card = await run_summary(store, request.path_params["run_id"])
        return JSONResponse(card.to_dict())

    async def rewards_page(request: Request) -> Response:
        view = await reward_view.reward_debugger(store, request.path_params["run_id"])
        return page("rewards.html", request, view=view, nav="runs")

    async def compare_page(request: Request) -> Response:
        q = request.query_params
        change = checkpoint_compare.parse_change(q.get("filter"))
        comparison = await checkpoint_compare.compare_checkpoints(
            store, request.path_params["run_id"], _int_param(q, "a"), _int_param(q, "b")
        )

        def link(**changed: Any) -> str:
            params = {"a": comparison.a, "b": comparison.b, "filter": change or "", **changed}
            return f"/runs/{comparison.run.run_id}/compare?" + urlencode({k: v for k, v in params.items() if v != ""})

        return page(
            "compare.html",
            request,
            c=comparison,
            change=change,
            rows=comparison.filtered(change),
            counts=comparison.counts,
            changes=checkpoint_compare.CHANGES,
            link=link,
            nav="runs",
        )

    async def api_compare(request: Request) -> Response:
        q = request.query_params
        comparison = await checkpoint_compare.compare_checkpoints(
            store, request.path_params["run_id"], _int_param(q, "a"), _int_param(q, "b")
        )
        return JSONResponse(checkpoint_compare.counts_json(comparison))

    async def rollouts_page(request: Request) -> Response:
        q = request.query_params
        query = _search(q)
        result = await store.search_rollouts(query)
        runs = await store.list_runs(limit=200)
        params = {k: v for k, v in q.items() if v and k != "page"}
        page_no = query.offset // PAGE_SIZE + 1
        pages = max(1, math.ceil(result.total / PAGE_SIZE))

        def link(n: int) -> str:
            return "/rollouts?" + urlencode({**params, "page": n})

        return page(
            "rollouts.html",
            request,
            result=result,
            runs=runs,
            q=q,
            page_no=page_no,
            pages=pages,
            prev_link=link(page_no - 1) if page_no > 1 else None,
            next_link=link(page_no + 1) if page_no < pages else None,
            statuses=[s.value for s in t.RolloutStatus],
            kinds=[k.value for k in t.ErrorKind],
            nav="rollouts",
        )

    async def trajectory_page(request: Request) -> Response:
        view = await views.trajectory(store, request.path_params["rollout_id"])
        return page("trajectory.html", request, v=view, nav="rollouts")

    async def health_page(request: Request) -> Response:
        health = await store.store_health()
        recent = await store.search_rollouts(RolloutSearch(status=[t.RolloutStatus.SUCCEEDED], limit=FIDELITY_SAMPLE))
        fidelity = await views.fidelity(store, [r.rollout_id for r in recent.items])
        return page("health.html", request, h=health, fidelity=fidelity, sampled=len(recent.items), nav="health")

    async def serve_index(request: Request) -> Response:
        runs = await serving.serve_runs(store)
        if runs:
            return RedirectResponse(f"/runs/{runs[0].run_id}/serving", 307)
        return page("serving.html", request, view=None, serve_runs=[], nav="serve")

    async def serving_page(request: Request) -> Response:
        run = await store.get_run(request.path_params["run_id"])
        if run.algorithm != serving.SERVE_ALGORITHM:  # a training run has no sessions: say so and link its page
            return page(
                "serving.html",
                request,
                view=None,
                training_run=run,
                serve_runs=await serving.serve_runs(store),
                nav="serve",
            )
        view = await serving.serving_view(store, run.run_id, sessions=_sessions(request))
        return page("serving.html", request, view=view, serve_runs=await serving.serve_runs(store), nav="serve")

    async def api_serving(request: Request) -> Response:
        view = await serving.serving_view(store, request.path_params["run_id"], sessions=_sessions(request))
        return JSONResponse(view.as_json())

    async def api_runs(request: Request) -> Response:
        runs = await store.list_runs(limit=200)
        return JSONResponse([r.model_dump(mode="json", exclude={"config"}) for r in runs])

    async def api_metrics(request: Request) -> Response:
        after = request.query_params.get("after_seq")
        try:
            after_seq = int(after) if after else None
        except ValueError:
            raise UserError(f"after_seq must be an integer, got {after!r}") from None
        rows = await store.get_run_metrics(request.path_params["run_id"], after_seq=after_seq)
        return JSONResponse([m.model_dump(mode="json") for m in rows])

    routes = [
        Route("/", index),
        Route("/runs", runs_page),
        Route("/runs/{run_id:path}/rewards", rewards_page),
        Route("/runs/{run_id:path}/serving", serving_page),
        Route("/runs/{run_id:path}/compare", compare_page),
        Route("/runs/{run_id:path}", run_page),
        Route("/rollouts", rollouts_page),
        Route("/rollouts/{rollout_id:path}", trajectory_page),
        Route("/health", health_page),
        Route("/serve", serve_index),
        Route("/api/runs", api_runs),
        Route("/api/runs/{run_id:path}/metrics", api_metrics),
        Route("/api/runs/{run_id:path}/summary", api_summary),
        Route("/api/runs/{run_id:path}/serving", api_serving),
        Route("/api/runs/{run_id:path}/compare", api_compare),
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={404: not_found, NotFoundError: not_found, UserError: bad_request, ValueError: bad_request},
    )
    app.add_middleware(_Guard, token=token)
    return app


def _sessions(request: Request) -> int:
    """The ``sessions`` query parameter (how many newest sessions the Serving page shows)."""
    value = request.query_params.get("sessions")
    if not value:
        return serving.DEFAULT_SESSIONS
    try:
        return int(value)
    except ValueError:
        raise UserError(f"sessions must be an integer, got {value!r}") from None


def _int_param(q: Any, name: str) -> int | None:
    """An optional integer query parameter (``UserError`` for anything else)."""
    value = q.get(name)
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise UserError(f"{name} must be an evaluation step (an integer), got {value!r}") from None


def _search(q: Any) -> RolloutSearch:
    """The rollouts page's query parameters as a search (``UserError`` for bad values)."""

    def num(name: str, cast: Any) -> Any:
        value = q.get(name)
        if value in (None, ""):
            return None
        try:
            return cast(value)
        except ValueError:
            raise UserError(f"{name} must be a number, got {value!r}") from None

    page_no = num("page", int) or 1
    status = q.get("status") or None
    kind = q.get("failure") or None
    try:
        return RolloutSearch(
            run_id=q.get("run") or None,
            step=num("step", int),
            status=[t.RolloutStatus(status)] if status else None,
            mode=t.RolloutMode(q["mode"]) if q.get("mode") else None,
            reward_min=num("reward_min", float),
            reward_max=num("reward_max", float),
            text=q.get("q") or None,
            failure_kind=t.ErrorKind(kind) if kind else None,
            limit=PAGE_SIZE,
            offset=(max(page_no, 1) - 1) * PAGE_SIZE,
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None
