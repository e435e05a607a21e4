"""W3C trace context from the agent's LLM requests to the gateway, so the gateway's LLM-call span
becomes a child of the span that made the call.

Instrumentations that record an LLM call as a span of their own (OpenInference, OpenLLMetry,
AgentOps, a user's ``start_as_current_span``) make it the current OpenTelemetry span while the
client sends the HTTP request. Without an HTTP instrumentation nothing tells the gateway about
it, and a span that records no response id (smolagents' model spans, for one) cannot be joined to
the gateway's span, which has the exact token ids. :func:`propagate_to_gateway` adds the current
span as a ``traceparent`` header to the requests that go to the current rollout's gateway
routes — and to no other request — so LightningRL joins the two by parentage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..tracing import current_rollout

if TYPE_CHECKING:
    from .hooks import AdapterHooks

__all__ = ["propagate_to_gateway", "traceparent_for"]

_ROLLOUT_HEADER = "x-agentbolt-rollout-id"


_CLIENT_MODULES = ("httpx", "httpx2")
"""HTTP clients of the LLM SDKs: httpx (Anthropic, LiteLLM, openai 1.x/2.x) and its fork httpx2 (openai 3.x)."""


def propagate_to_gateway(hooks: AdapterHooks) -> bool:
    """While ``hooks`` are installed, requests sent with httpx or httpx2 (sync and async: what
    the OpenAI, Anthropic and LiteLLM clients use) to the current rollout's gateway carry the
    current span as ``traceparent``, unless they already carry one. Returns False when a client's
    ``send`` could not be wrapped (a version that changed it; ``hooks.warn`` says so)."""
    import importlib

    wrapped = []
    for name in _CLIENT_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for owner in (module.Client, module.AsyncClient):
            wrapped.append(hooks.wrap(owner, "send", before=_add_traceparent, needs=("request",)))
    if not all(wrapped):
        hooks.warn(
            "propagation",
            "httpx's Client.send changed: LLM requests do not carry the instrumentation's span to the gateway, "
            "so LLM spans without a response id cannot be joined to the gateway's token ids",
        )
    return bool(wrapped) and all(wrapped)


def _add_traceparent(call: Any) -> None:
    request = call["request"]
    value = traceparent_for(request.url.path, request.headers)
    if value is not None:
        request.headers["traceparent"] = value
    return None  # nothing to do after the call


def traceparent_for(path: str, headers: Any) -> str | None:
    """The ``traceparent`` to add to a request with this URL path and headers: the current
    OpenTelemetry span's, when the request goes to the current rollout's gateway (its
    ``/rollouts/{rid}/attempts/{aid}/`` route, or the rollout header) and carries none yet."""
    ctx = current_rollout()
    if ctx is None or ctx.sink is None or "traceparent" in headers:
        return None
    route = f"/rollouts/{ctx.rollout_id}/attempts/{ctx.attempt_id}/"
    if route not in path and headers.get(_ROLLOUT_HEADER) != ctx.rollout_id:
        return None
    from opentelemetry import trace

    span = trace.get_current_span().get_span_context()
    if not span.is_valid:
        return None
    return f"00-{span.trace_id:032x}-{span.span_id:016x}-{int(span.trace_flags):02x}"
