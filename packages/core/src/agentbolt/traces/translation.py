"""Traced spans as agentbolt spans: the instrumentation adapters' translation, then token ids rebuilt.

:class:`SpanTranslation` does to a span that arrived by OTLP what a runner does to a span captured
live:

1. **Adapters.** Every installed adapter plugin whose hooks translate another instrumentation's
   OpenTelemetry spans (:class:`~agentbolt.capture.adapters.OtelSpanHooks`: AgentOps,
   OpenInference, OpenLLMetry) is asked, in registry order, to map the span; the first that
   recognises it makes it an agent, LLM, tool or operation unit (``agentbolt.span.kind``,
   ``gen_ai.agent.name``, ``gen_ai.tool.name``, messages...). Its ids, parent, times and status
   stay the instrumentation's. A span no adapter recognises is stored as it came.
2. **Token ids.** Each LLM span is rebuilt as the Chat Completions exchange it was
   (:func:`.messages.call_exchange`): its ``gen_ai.input.messages`` / ``gen_ai.output.messages``
   are rewritten in OpenAI chat form (what the gateway records; GenAI ``parts`` from OpenLLMetry
   become ``content`` / ``tool_calls``) and ``agentbolt.llm.request`` holds the model and tools;
   it is then retokenized with the policy's tokenizer
   (:class:`~agentbolt.capture.retokenize.ChatTemplateRetokenizer`); the drift check compares the
   rebuilt ids with the usage the provider reported. The span then carries
   ``agentbolt.llm.token_source = "retokenized"`` and the ids (plus ``agentbolt.llm.token_drift``
   when the check failed: LightningRL excludes it as ``token_drift``), or ``"missing"`` with
   ``agentbolt.llm.token_missing_reason`` saying why (no tokenizer, no messages recorded, the
   tokenizer failed): LightningRL excludes it as ``no_token_ids`` with that reason.

Either way every LLM span of a trace becomes exactly one LightningRL call (a span with a token
source is a call span of its own; no gateway span exists to join).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from .. import semconv
from .. import types as t
from ..capture.adapters import OtelSpanHooks
from ..capture.retokenize import ChatTemplateRetokenizer, drift_reasons
from ..lightningrl import spans as sp
from ..plugins.registry import default_plugins
from .messages import call_exchange

__all__ = ["SpanTranslation", "otel_span_hooks"]

log = logging.getLogger(__name__)


def otel_span_hooks(plugins: Any = None, names: list[str] | None = None) -> list[OtelSpanHooks]:
    """Fresh (never installed) span-translating hooks of the installed adapter plugins, in
    registry order; ``names`` restricts them. An adapter whose package cannot be imported is
    skipped (logged); opt-in adapters (``auto = False``) are left out unless named."""
    if plugins is None:
        plugins = default_plugins()
    hooks: list[OtelSpanHooks] = []
    for entry in plugins.adapters:
        if names is not None and entry.name not in names:
            continue
        try:
            adapter_type = type(entry.value())
            if names is None and not adapter_type.auto:
                continue
            made = adapter_type.make_hooks()
        except Exception as exc:
            log.info("adapter %s does not translate traced spans here: %s", entry.name, exc)
            continue
        if isinstance(made, OtelSpanHooks):
            hooks.append(made)
    return hooks


class SpanTranslation:
    """Translate and retokenize traced spans (see the module docstring).

    Args:
        tokenizer: the policy's tokenizer: a Hugging Face name or path, a tokenizer object, or a
            :class:`~agentbolt.capture.retokenize.ChatTemplateRetokenizer`; ``None`` leaves every
            LLM call without ids (``token_source = "missing"``, reason ``no tokenizer``).
        hooks: the span-translating hooks to use (default: :func:`otel_span_hooks`).
    """

    def __init__(self, tokenizer: Any = None, *, hooks: list[OtelSpanHooks] | None = None) -> None:
        if tokenizer is None or isinstance(tokenizer, ChatTemplateRetokenizer):
            self.retokenizer: ChatTemplateRetokenizer | None = tokenizer
        elif isinstance(tokenizer, str):
            self.retokenizer = ChatTemplateRetokenizer.from_pretrained(tokenizer)
        else:
            self.retokenizer = ChatTemplateRetokenizer(tokenizer)
        self.hooks = otel_span_hooks() if hooks is None else list(hooks)

    @property
    def adapters(self) -> list[str]:
        """Names of the adapters that translate (for status and logs)."""
        return [h.adapter for h in self.hooks]

    def translate(self, span: t.Span) -> t.Span:
        """The span as the first adapter that recognises it maps it (unchanged when none does,
        or when it already says which adapter made it); LLM spans then get their token ids."""
        if semconv.ADAPTER not in span.attributes:
            for hooks in self.hooks:
                try:
                    record = hooks.map_span(span)
                except Exception as exc:
                    hooks.guard("mapping a traced span", exc)
                    continue
                if record is None:
                    continue
                translated = hooks.recorder.translate(span, record)
                if translated is not None:
                    span = translated
                    break
        if sp.is_llm_span(span) and semconv.TOKEN_SOURCE not in span.attributes:
            span = self.retokenize(span)
        return span

    def retokenize(self, span: t.Span) -> t.Span:
        """An LLM span with rebuilt ids and the drift check's verdict, or marked ``missing`` with why."""
        attrs = dict(span.attributes)
        exchange = call_exchange(span)
        if (
            exchange is not None
        ):  # the messages in one shape, the gateway's (OpenAI chat), whatever the instrumentation's
            request, response = exchange
            attrs[semconv.GEN_AI_INPUT_MESSAGES] = orjson.dumps(request["messages"]).decode()
            choice = response["choices"][0]
            output = {**choice["message"], "finish_reason": choice["finish_reason"]}
            attrs[semconv.GEN_AI_OUTPUT_MESSAGES] = orjson.dumps([output]).decode()
            attrs[semconv.LLM_REQUEST] = orjson.dumps({k: v for k, v in request.items() if k != "messages"}).decode()
        ids: tuple[list[int], list[int]] | None = None
        reason = None
        if self.retokenizer is None:
            reason = "no tokenizer: give the policy's tokenizer (agentbolt ingest --tokenizer) to rebuild ids"
        elif span.status.code is t.StatusCode.ERROR:
            reason = f"the call failed: {span.status.message or 'status ERROR'}"
        elif exchange is None:
            reason = "the span recorded no input or output messages (enable the instrumentation's content capture)"
        else:
            try:
                ids = self.retokenizer(*exchange)
            except Exception as exc:
                reason = f"retokenizing failed: {type(exc).__name__}: {exc}"[:500]
            else:
                if ids is None:
                    reason = "the recorded response has no choice to retokenize"
        if ids is None or exchange is None:
            attrs[semconv.TOKEN_SOURCE] = semconv.TOKEN_SOURCE_MISSING
            attrs[semconv.TOKEN_MISSING_REASON] = reason or "no ids"
            return span.model_copy(update={"attributes": attrs})
        prompt_ids, response_ids = list(ids[0]), list(ids[1])
        attrs[semconv.TOKEN_SOURCE] = semconv.TOKEN_SOURCE_RETOKENIZED
        attrs[semconv.PROMPT_TOKEN_IDS] = prompt_ids
        attrs[semconv.RESPONSE_TOKEN_IDS] = response_ids
        assert self.retokenizer is not None
        drift = drift_reasons(exchange[1], prompt_ids, response_ids, self.retokenizer.decode)
        if not (exchange[1].get("usage") or {}):
            drift.append("the span reported no token usage: the rebuilt ids cannot be checked")
        if drift:
            attrs[semconv.TOKEN_DRIFT] = "; ".join(drift)
        if semconv.GEN_AI_RESPONSE_FINISH_REASONS not in attrs:
            attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] = [str(exchange[1]["choices"][0]["finish_reason"])]
        return span.model_copy(update={"attributes": attrs})
