"""Shared pieces of the ``agentbolt serve`` tests: a server in front of the fake LLM, clients."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.online import OnlineServer
from agentbolt.store import Store

TOKEN = "s3cret"


def openai_client(server: OnlineServer, *, token: str = TOKEN, **headers: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url, api_key=token, max_retries=0, default_headers=headers or None)


def anthropic_client(server: OnlineServer, *, token: str = TOKEN, **headers: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=server.gateway.url, api_key=token, max_retries=0, default_headers=headers or None
    )


async def post_feedback(
    server: OnlineServer, body: Mapping[str, Any] | str, *, token: str | None = TOKEN
) -> httpx.Response:
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    content = body if isinstance(body, str) else httpx.Request("POST", "http://x", json=body).content
    async with httpx.AsyncClient() as client:
        return await client.post(f"{server.gateway.url}/v1/feedback", content=content, headers=headers)


async def session_rollouts(store: Store, run_id: str) -> list[t.Rollout]:
    page = await store.search_rollouts(_search(run_id))
    return [r for r in page.items if "agentbolt.session.id" in r.metadata]


def _search(run_id: str) -> Any:
    from agentbolt.store import RolloutSearch

    return RolloutSearch(run_id=run_id, mode=t.RolloutMode.TRAIN, limit=1000)


async def llm_spans(server: OnlineServer, rollout_id: str) -> list[t.Span]:
    await server.gateway.flush()
    spans = (await server.store.query_spans([rollout_id]))[rollout_id]
    return [s for s in spans if s.attributes.get(semconv.SPAN_KIND_ATTR) == semconv.KIND_LLM]


async def reward_spans(server: OnlineServer, rollout_id: str) -> list[t.Span]:
    spans = (await server.store.query_spans([rollout_id]))[rollout_id]
    return [s for s in spans if s.attributes.get(semconv.SPAN_KIND_ATTR) == semconv.KIND_REWARD]


def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'serve.db'}"
