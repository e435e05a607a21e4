"""AgentOps' spans as agentbolt units, AgentOps kept local without an API key, and AgentOps as the
runner's tracer (see :mod:`agentbolt_agentops.adapter`). AgentOps itself is imported only when
the agent imports it, or when the tracer initializes it."""

from __future__ import annotations

import logging
import os
from typing import Any
from urllib.parse import urlparse

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.capture.adapters import OtelSpanHooks, UnitRecord, call_arguments, first_attribute, text_attribute

__all__ = ["AgentOpsHooks"]

log = logging.getLogger(__name__)

SPAN_KIND = "agentops.span.kind"
ENTITY_NAME = "agentops.entity.name"
ENTITY_INPUT = "agentops.entity.input"
ENTITY_OUTPUT = "agentops.entity.output"
OPERATION_NAME = "operation.name"
AGENT_NAME = "agent.name"
TOOL_NAME = "tool.name"
LLM_REQUEST_TYPE = "gen_ai.request.type"
"""AgentOps' LLM client spans (OpenAI, Anthropic, Google GenAI...): ``chat``, ``completion``..."""
_OPERATION_KINDS = {"chat": semconv.OP_CHAT, "completion": semconv.OP_TEXT_COMPLETION}
_CLOUD_DOMAIN = "agentops.ai"
_API_KEY_ENV = "AGENTOPS_API_KEY"
_MAX_TEXT = 16 * 1024
_KEPT_LOCAL = "__agentbolt_kept_local__"


class AgentOpsHooks(OtelSpanHooks):
    """Maps AgentOps' spans; keeps its cloud exporters quiet without an API key; with
    ``manage``, initializes AgentOps when the process has not."""

    def __init__(self, adapter: str, *, manage: bool = False) -> None:
        super().__init__(adapter)
        self.manage = manage

    def install(self) -> None:
        super().install()
        keep_agentops_local()
        if self.manage:
            _init_agentops()

    # -- structure ------------------------------------------------------------------------------

    def map_span(self, span: t.Span) -> UnitRecord | None:
        kind = span.attributes.get(SPAN_KIND)
        if kind == "agent":
            return UnitRecord(semconv.KIND_AGENT, "", {semconv.GEN_AI_AGENT_NAME: _agent_name(span)})
        if kind == "tool":
            return UnitRecord(semconv.KIND_TOOL, "", _tool_attributes(span))
        request_type = span.attributes.get(LLM_REQUEST_TYPE)
        if kind == "llm" or request_type in _OPERATION_KINDS:
            operation = _OPERATION_KINDS.get(str(request_type), semconv.OP_CHAT)
            return UnitRecord(semconv.KIND_LLM, "", {semconv.GEN_AI_OPERATION_NAME: operation})
        if isinstance(kind, str) and kind:  # session, workflow, task, operation, chain...
            name = first_attribute(span, ENTITY_NAME, OPERATION_NAME) or span.name
            return UnitRecord(semconv.KIND_OPERATION, "", {semconv.OPERATION_NAME: name})
        return None


def _agent_name(span: t.Span) -> str:
    name = first_attribute(span, AGENT_NAME, ENTITY_NAME, OPERATION_NAME)
    if isinstance(name, str):
        return name
    return span.name.removesuffix(".agent")  # the decorators name spans "{name}.agent"


def _tool_attributes(span: t.Span) -> dict[str, Any]:
    attrs = span.attributes
    return {
        semconv.GEN_AI_TOOL_NAME: first_attribute(span, TOOL_NAME, ENTITY_NAME, OPERATION_NAME)
        or span.name.removesuffix(".tool"),
        semconv.GEN_AI_TOOL_CALL_ARGUMENTS: text_attribute(
            call_arguments(first_attribute(span, "agentops.tool.input", ENTITY_INPUT)), _MAX_TEXT
        ),
        semconv.GEN_AI_TOOL_CALL_RESULT: text_attribute(
            attrs.get("agentops.tool.output", attrs.get(ENTITY_OUTPUT)), _MAX_TEXT
        ),
    }


# -- nothing to AgentOps' cloud without an API key ------------------------------------------------


def keep_agentops_local() -> None:
    """From now on (for the process), AgentOps sends nothing to its cloud while it has no API key:
    neither its span and metric exporters nor its uploads (the log upload its default trace's
    processor makes when the trace ends, at exit: everything the process printed; the objects its
    OpenAI Agents instrumentation uploads). Applied when AgentOps' modules are imported (now, if
    they are); idempotent."""
    import wrapt

    wrapt.register_post_import_hook(_quiet_span_exporter, "agentops.sdk.exporters")
    wrapt.register_post_import_hook(_quiet_metric_exporter, "opentelemetry.exporter.otlp.proto.http.metric_exporter")
    wrapt.register_post_import_hook(_quiet_uploads, "agentops.client.api.versions.v4")


def _quiet_span_exporter(module: Any) -> None:
    from opentelemetry.sdk.trace.export import SpanExportResult

    _quiet(module.AuthenticatedOTLPExporter, SpanExportResult.SUCCESS)


def _quiet_metric_exporter(module: Any) -> None:
    from opentelemetry.sdk.metrics.export import MetricExportResult

    _quiet(module.OTLPMetricExporter, MetricExportResult.SUCCESS)


def _quiet_uploads(module: Any) -> None:
    # V4Client.upload_logfile / upload_object return the API's JSON answer; an upload not made
    # answers {} (AgentOps reads no field of the log upload's answer, and none of an object's is required).
    for method in ("upload_logfile", "upload_object"):
        _quiet(module.V4Client, {}, method=method, endpoint_attribute="endpoint")


def _quiet(cls: Any, dropped: Any, *, method: str = "export", endpoint_attribute: str = "_endpoint") -> None:
    """Wrap ``method`` of the class ``cls`` (AgentOps' or OpenTelemetry's exporter, AgentOps' API
    client; untyped): a call whose instance is aimed at AgentOps' cloud (its ``endpoint_attribute``)
    without an API key sends nothing and returns ``dropped`` (an export reported as done, so
    nothing retries); every other call goes as before."""
    import wrapt

    if getattr(cls.__dict__.get(method), _KEPT_LOCAL, False):
        return

    @wrapt.decorator
    def quiet(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        if _to_cloud_without_key(getattr(instance, endpoint_attribute, None)):
            return dropped
        return wrapped(*args, **kwargs)

    wrapper = quiet(cls.__dict__[method])
    setattr(wrapper, _KEPT_LOCAL, True)
    setattr(cls, method, wrapper)


def _to_cloud_without_key(endpoint: Any) -> bool:
    host = urlparse(endpoint).hostname if isinstance(endpoint, str) else None
    if host is None or not (host == _CLOUD_DOMAIN or host.endswith("." + _CLOUD_DOMAIN)):
        return False
    return not _api_key()


def _api_key() -> str | None:
    key = os.environ.get(_API_KEY_ENV)
    if key:
        return key
    try:
        import agentops

        return agentops.get_client().config.api_key or None
    except Exception:
        return None


def _init_agentops() -> None:
    """Initialize AgentOps as the runner's tracer, unless the process already did."""
    import agentops
    from agentops.sdk.core import tracer

    if tracer.initialized:
        return
    agentops.init(auto_start_session=False, instrument_llm_calls=True)
    log.info("AgentOps initialized as the rollouts' tracer (agentops-tracer adapter)")
