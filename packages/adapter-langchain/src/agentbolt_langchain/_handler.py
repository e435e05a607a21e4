"""The callback handler and its LangChain configure hook (this module imports langchain-core).

One handler per process is registered with ``register_configure_hook`` through a
``ContextVar`` whose default is the handler, so LangChain adds it to every run's callback
manager (``inheritable``: child runs get it too) without a ``callbacks=`` argument. LangChain
offers no way to unregister a hook, so the handler stays registered; it is inert while no
adapter is attached, and otherwise handles events only for runs that start while a rollout
is current (or under a run that did): its ``ignore_*`` properties say so before LangChain
dispatches an event.

Translation only: each callback turns LangChain's arguments into a
:class:`~agentbolt.adapters.UnitRecord` keyed by LangChain's ``run_id`` (parent:
``parent_run_id``), and the adapter's :class:`~agentbolt.adapters.SpanRecorder` builds and
routes the spans. No context is attached or detached here, and no exception reaches LangChain.
"""

from __future__ import annotations

import contextvars
import json
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.tracers import context as lc_context

from agentbolt import semconv
from agentbolt.adapters import UnitRecord
from agentbolt.tracing import current_rollout

if TYPE_CHECKING:
    from .adapter import LangChainAdapter

__all__ = ["HOOK_VAR_NAME", "AgentboltCallbackHandler", "installed_handler"]

log = logging.getLogger(__name__)

HOOK_VAR_NAME = "agentbolt_langchain_handler"
"""Name of the ``ContextVar`` registered with LangChain (how a second copy finds the first)."""

RUN_ID = "langchain.run_id"
LANGGRAPH_NODE = "langgraph.node"
LANGGRAPH_STEP = "langgraph.step"
LANGGRAPH_CONTROL_FLOW = "langgraph.control_flow"
TOOL_DESCRIPTION = "gen_ai.tool.description"
TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_CALL_RESULT = "gen_ai.tool.call.result"

_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool", "function": "function"}
_MAX_CONTENT = 65536


class AgentboltCallbackHandler(BaseCallbackHandler):
    """Translates LangChain callbacks into units of the attached adapter's recorder.

    Shared by every :class:`~agentbolt_langchain.LangChainAdapter` of the process: the first
    attached adapter records, the others wait their turn.
    """

    run_inline = True  # thread-safe and non-blocking: no executor hop in async callback managers
    raise_error = False

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._adapters: list[LangChainAdapter] = []
        self.adapter: LangChainAdapter | None = None
        """The adapter recording now (the first attached), or ``None``."""
        self._open: set[UUID] = set()  # runs recorded as units
        self._skipped: dict[UUID, UUID] = {}  # chain runs not recorded -> nearest recorded ancestor
        self._logged: set[str] = set()
        self.errors = 0
        """Translation errors swallowed (each type is logged once)."""

    # -- adapters ---------------------------------------------------------------------------------

    def attach(self, adapter: LangChainAdapter) -> None:
        """Add an instrumented adapter (it records if it is the first)."""
        with self._lock:
            if not any(a is adapter for a in self._adapters):
                self._adapters.append(adapter)
            self._set_active()

    def detach(self, adapter: LangChainAdapter) -> None:
        """Remove an adapter; the next attached one, if any, takes over."""
        with self._lock:
            self._adapters = [a for a in self._adapters if a is not adapter]
            self._set_active()

    def _set_active(self) -> None:
        active = self._adapters[0] if self._adapters else None
        if active is not self.adapter:
            self._open.clear()  # units of the previous recorder are its own; it discards them
            self._skipped.clear()
            self.adapter = active

    # -- when LangChain dispatches to us ------------------------------------------------------------

    def _ignored(self) -> bool:
        if self.adapter is None:
            return True
        return not self._open and not self._skipped and not _in_rollout()

    @property
    def ignore_chain(self) -> bool:
        return self._ignored()

    @property
    def ignore_llm(self) -> bool:
        return self._ignored()

    @property
    def ignore_chat_model(self) -> bool:
        return self._ignored()

    @property
    def ignore_agent(self) -> bool:  # LangChain gates tool events on this one
        return self._ignored()

    @property
    def ignore_retriever(self) -> bool:
        return True

    @property
    def ignore_retry(self) -> bool:
        return True

    @property
    def ignore_custom_event(self) -> bool:
        return True

    # -- bookkeeping --------------------------------------------------------------------------------

    def _guard(self, what: str, exc: BaseException) -> None:
        self.errors += 1
        kind = f"{what}:{type(exc).__name__}"
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning("langchain adapter: %s failed (%r); LangChain is unaffected", what, exc)

    def _parent(self, parent_run_id: UUID | None) -> tuple[UUID | None, bool]:
        """(nearest recorded ancestor, whether the parent run is one we track)."""
        if parent_run_id is None:
            return None, False
        with self._lock:
            if parent_run_id in self._open:
                return parent_run_id, True
            ancestor = self._skipped.get(parent_run_id)
        return ancestor, ancestor is not None

    def _start(self, adapter: LangChainAdapter, run_id: UUID, record: UnitRecord, parent: UUID | None) -> None:
        with self._lock:
            self._open.add(run_id)
        adapter.recorder.start(run_id, record, parent_key=parent)

    def _close(self, run_id: UUID) -> LangChainAdapter | None:
        """Forget a run; the adapter whose unit it is, or ``None`` when it is not one."""
        with self._lock:
            if self._skipped.pop(run_id, None) is not None or run_id not in self._open:
                return None
            self._open.discard(run_id)
            return self.adapter

    def _skip(self, run_id: UUID, ancestor: UUID | None) -> None:
        """Leave ``run_id`` out (not a span, or its start failed): its children attach to ``ancestor``."""
        if ancestor is None:
            return
        with self._lock:
            if run_id not in self._open:
                self._skipped[run_id] = ancestor

    # -- chains: the outermost run and LangGraph nodes are agents -------------------------------------

    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        adapter = self.adapter
        if adapter is None:
            return
        parent, known = None, False
        try:
            parent, known = self._parent(parent_run_id)
            if not known and not _in_rollout():
                return
            name = kwargs.get("name") or _serialized_name(serialized) or "chain"
            meta = metadata or {}
            attrs: dict[str, Any] = {RUN_ID: str(run_id)}
            if known:  # inside a recorded run: only LangGraph node runs become spans
                node = meta.get("langgraph_node")
                if node != name or not isinstance(node, str) or node.startswith("__"):
                    self._skip(run_id, parent)
                    return
                agent = _node_path(meta, node) if adapter.agent_names == "path" else node
                attrs[LANGGRAPH_NODE] = node
                attrs[LANGGRAPH_STEP] = meta.get("langgraph_step")
            else:  # the outermost run of this rollout's LangChain work
                agent = str(name)
            attrs[semconv.GEN_AI_AGENT_NAME] = agent
            self._start(adapter, run_id, UnitRecord(semconv.KIND_AGENT, f"invoke_agent {agent}", attrs), parent)
        except Exception as exc:
            self._guard("on_chain_start", exc)
            self._skip(run_id, parent)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        try:
            adapter = self._close(run_id)
            if adapter is not None:
                adapter.recorder.end(run_id)
        except Exception as exc:
            self._guard("on_chain_end", exc)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        try:
            adapter = self._close(run_id)
            if adapter is None:
                return
            if _is_control_flow(error):  # interrupts, Command(graph=PARENT): not failures
                adapter.recorder.end(run_id, attributes={LANGGRAPH_CONTROL_FLOW: type(error).__name__})
            else:
                adapter.recorder.end(run_id, error=error)
        except Exception as exc:
            self._guard("on_chain_error", exc)

    # -- model calls ----------------------------------------------------------------------------------

    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: list[list[Any]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._model_start(semconv.OP_CHAT, serialized, messages, run_id, parent_run_id, metadata, kwargs)

    def on_llm_start(
        self,
        serialized: dict[str, Any] | None,
        prompts: list[str],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._model_start(semconv.OP_TEXT_COMPLETION, serialized, prompts, run_id, parent_run_id, metadata, kwargs)

    def _model_start(
        self,
        operation: str,
        serialized: dict[str, Any] | None,
        inputs: Sequence[Any],
        run_id: UUID,
        parent_run_id: UUID | None,
        metadata: dict[str, Any] | None,
        kwargs: Mapping[str, Any],
    ) -> None:
        adapter = self.adapter
        if adapter is None:
            return
        try:
            parent, known = self._parent(parent_run_id)
            if not known and not _in_rollout():
                return
            meta = metadata or {}
            params = kwargs.get("invocation_params") or {}
            model = params.get("model") or params.get("model_name") or meta.get("ls_model_name")
            attrs: dict[str, Any] = {
                RUN_ID: str(run_id),
                semconv.GEN_AI_OPERATION_NAME: operation,
                semconv.GEN_AI_REQUEST_MODEL: model if isinstance(model, str) else None,
                semconv.GEN_AI_SYSTEM: meta.get("ls_provider"),
                semconv.GEN_AI_REQUEST_TEMPERATURE: _number(params.get("temperature", meta.get("ls_temperature"))),
                semconv.GEN_AI_REQUEST_TOP_P: _number(params.get("top_p")),
                semconv.GEN_AI_REQUEST_MAX_TOKENS: _number(
                    params.get("max_tokens") or params.get("max_completion_tokens") or meta.get("ls_max_tokens")
                ),
            }
            if adapter.capture_content and inputs:
                first = inputs[0]
                attrs[semconv.GEN_AI_INPUT_MESSAGES] = _json(
                    [{"role": "user", "content": first}] if isinstance(first, str) else [_message(m) for m in first]
                )
            name = f"{operation} {model}" if isinstance(model, str) and model else operation
            self._start(adapter, run_id, UnitRecord(semconv.KIND_LLM, name, attrs), parent)
        except Exception as exc:
            self._guard("on_llm_start", exc)

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        try:
            adapter = self._close(run_id)
            if adapter is None:
                return
            try:
                attrs = _result_attributes(response, adapter.capture_content)
            except Exception as exc:  # a field we could not read does not lose the span
                self._guard("reading the LLM result", exc)
                attrs = {}
            adapter.recorder.end(run_id, attributes=attrs)
        except Exception as exc:
            self._guard("on_llm_end", exc)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        try:
            adapter = self._close(run_id)
            if adapter is not None:
                adapter.recorder.end(run_id, error=error)
        except Exception as exc:
            self._guard("on_llm_error", exc)

    # -- tools ----------------------------------------------------------------------------------------

    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        adapter = self.adapter
        if adapter is None:
            return
        parent = None
        try:
            parent, known = self._parent(parent_run_id)
            if not known and not _in_rollout():
                return
            name = kwargs.get("name") or _serialized_name(serialized) or "tool"
            attrs: dict[str, Any] = {
                RUN_ID: str(run_id),
                semconv.GEN_AI_TOOL_NAME: name,
                semconv.GEN_AI_TOOL_CALL_ID: kwargs.get("tool_call_id"),
            }
            if adapter.capture_content:
                attrs[TOOL_DESCRIPTION] = (serialized or {}).get("description")
                attrs[TOOL_CALL_ARGUMENTS] = _json(inputs) if inputs is not None else input_str
            self._start(adapter, run_id, UnitRecord(semconv.KIND_TOOL, f"execute_tool {name}", attrs), parent)
        except Exception as exc:
            self._guard("on_tool_start", exc)
            self._skip(run_id, parent)  # runs the tool starts still attach to the nearest recorded run

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        try:
            adapter = self._close(run_id)
            if adapter is None:
                return
            attrs: dict[str, Any] = {}
            error: str | None = None
            try:
                call_id = getattr(output, "tool_call_id", None)  # a ToolMessage
                if isinstance(call_id, str):
                    attrs[semconv.GEN_AI_TOOL_CALL_ID] = call_id
                content = getattr(output, "content", output)
                if getattr(output, "status", None) == "error":  # the tool handled its own error
                    error = f"tool returned an error: {_text(content)[:2000]}"
                if adapter.capture_content:
                    attrs[TOOL_CALL_RESULT] = _text(content)[:_MAX_CONTENT]
            except Exception as exc:  # a field we could not read does not lose the span
                self._guard("reading the tool output", exc)
            adapter.recorder.end(run_id, attributes=attrs, error=error)
        except Exception as exc:
            self._guard("on_tool_end", exc)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        try:
            adapter = self._close(run_id)
            if adapter is not None:
                call_id = kwargs.get("tool_call_id")
                attrs = {semconv.GEN_AI_TOOL_CALL_ID: call_id} if isinstance(call_id, str) else None
                adapter.recorder.end(run_id, attributes=attrs, error=error)
        except Exception as exc:
            self._guard("on_tool_error", exc)


# -- translation helpers ------------------------------------------------------------------------------


def _in_rollout() -> bool:
    """A rollout that records spans is current (not one run with ``sink=None``, e.g. an agent's unit test)."""
    ctx = current_rollout()
    return ctx is not None and ctx.sink is not None


def _serialized_name(serialized: Mapping[str, Any] | None) -> str | None:
    if not serialized:
        return None
    name = serialized.get("name")
    if isinstance(name, str) and name:
        return name
    ids = serialized.get("id")
    if isinstance(ids, list) and ids and isinstance(ids[-1], str):
        return ids[-1]
    return None


def _node_path(meta: Mapping[str, Any], node: str) -> str:
    """``outer/inner`` from LangGraph's checkpoint namespace (``outer:<task>|inner:<task>``)."""
    ns = meta.get("langgraph_checkpoint_ns")
    if not isinstance(ns, str) or not ns:
        return node
    parts = [seg.split(":", 1)[0] for seg in ns.split("|") if seg]
    if not parts or parts[-1] != node:
        return node
    return "/".join(parts)


def _is_control_flow(error: BaseException) -> bool:
    """LangGraph's GraphBubbleUp family (interrupts, parent commands) ends a run without failing it."""
    return any(
        cls.__name__ == "GraphBubbleUp" and cls.__module__.startswith("langgraph") for cls in type(error).__mro__
    )


def _number(value: Any) -> float | int | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _json(value: Any) -> str:
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= _MAX_CONTENT else text[:_MAX_CONTENT]


def _text(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, default=str, ensure_ascii=False)


def _message(message: Any) -> dict[str, Any]:
    """An OpenAI-shaped dict of a LangChain message (role, content, tool calls)."""
    kind = getattr(message, "type", None)
    role = getattr(message, "role", None) if kind == "chat" else _ROLES.get(str(kind), str(kind))
    out: dict[str, Any] = {"role": role, "content": getattr(message, "content", None)}
    calls = getattr(message, "tool_calls", None)
    if calls:
        out["tool_calls"] = [
            {
                "id": c.get("id"),
                "type": "function",
                "function": {"name": c.get("name"), "arguments": json.dumps(c.get("args"), default=str)},
            }
            for c in calls
        ]
    call_id = getattr(message, "tool_call_id", None)
    if call_id:
        out["tool_call_id"] = call_id
    return out


def _result_attributes(response: Any, capture_content: bool) -> dict[str, Any]:
    """Response id, model, finish reasons and usage of an ``LLMResult`` (one prompt's generations)."""
    generations = (getattr(response, "generations", None) or [[]])[0]
    llm_output = getattr(response, "llm_output", None) or {}
    first = generations[0] if generations else None
    message = getattr(first, "message", None)
    metadata = getattr(message, "response_metadata", None) or {}
    # langchain-openai puts the OpenAI response id in both places; other providers in either.
    response_id = metadata.get("id") or llm_output.get("id")
    model = metadata.get("model_name") or metadata.get("model") or llm_output.get("model_name")
    reasons = []
    for gen in generations:
        info = getattr(gen, "generation_info", None) or {}
        meta = getattr(getattr(gen, "message", None), "response_metadata", None) or {}
        reason = info.get("finish_reason") or meta.get("finish_reason") or meta.get("stop_reason")
        if isinstance(reason, str):
            reasons.append(reason)
    attrs: dict[str, Any] = {
        semconv.GEN_AI_RESPONSE_ID: response_id if isinstance(response_id, str) and response_id else None,
        semconv.GEN_AI_RESPONSE_MODEL: model if isinstance(model, str) else None,
        semconv.GEN_AI_RESPONSE_FINISH_REASONS: reasons or None,
    }
    usage = getattr(message, "usage_metadata", None)
    if usage:
        attrs[semconv.GEN_AI_USAGE_INPUT_TOKENS] = usage.get("input_tokens")
        attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] = usage.get("output_tokens")
    else:
        token_usage = llm_output.get("token_usage") or {}
        attrs[semconv.GEN_AI_USAGE_INPUT_TOKENS] = _number(token_usage.get("prompt_tokens"))
        attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] = _number(token_usage.get("completion_tokens"))
    if capture_content and generations:
        attrs[semconv.GEN_AI_OUTPUT_MESSAGES] = _json(
            [
                _message(g.message)
                if getattr(g, "message", None) is not None
                else {"role": "assistant", "content": g.text}
                for g in generations
            ]
        )
    return attrs


# -- the configure hook -------------------------------------------------------------------------------

_INSTALL_LOCK = threading.Lock()
_HANDLER: AgentboltCallbackHandler | None = None


def installed_handler() -> AgentboltCallbackHandler:
    """The process's handler, registered with LangChain's configure hooks on first use.

    Registered once per process: a hook already registered under :data:`HOOK_VAR_NAME` (by a
    reloaded or second copy of this module) is reused rather than registered again, so runs
    are never recorded twice.
    """
    global _HANDLER
    if _HANDLER is not None:
        return _HANDLER
    with _INSTALL_LOCK:
        if _HANDLER is None:
            handler = _registered_handler()
            if handler is None:
                handler = AgentboltCallbackHandler()
                var: contextvars.ContextVar[Any] = contextvars.ContextVar(HOOK_VAR_NAME, default=handler)
                lc_context.register_configure_hook(var, inheritable=True)
            _HANDLER = handler
        return _HANDLER


def _registered_handler() -> AgentboltCallbackHandler | None:
    for entry in getattr(lc_context, "_configure_hooks", ()):
        var = entry[0] if isinstance(entry, tuple) and entry else None
        if getattr(var, "name", None) != HOOK_VAR_NAME:
            continue
        try:
            handler = contextvars.Context().run(var.get)  # type: ignore[union-attr]
        except LookupError:
            continue
        if callable(getattr(handler, "attach", None)) and callable(getattr(handler, "detach", None)):
            return handler  # type: ignore[no-any-return]
    return None
