"""The callback handler and its LangChain configure hook (this module imports langchain-core).

The handler is the adapter's :class:`~agentbolt.capture.adapters.AdapterHooks`: one per process,
registered with ``register_configure_hook`` through a ``ContextVar`` whose default is the
handler, so LangChain adds it to every run's callback manager (``inheritable``: child runs get
it too) without a ``callbacks=`` argument. LangChain offers no way to unregister a hook, so the
handler stays registered; it is inert while no adapter is instrumented, and otherwise handles
events only for runs that start while a rollout is current (or under a run that did): its
``ignore_*`` properties say so before LangChain dispatches an event. The first instrumented
adapter's options (``agent_names``, ``capture_content``) apply.

Translation only: each callback turns LangChain's arguments into a
:class:`~agentbolt.capture.adapters.UnitRecord` keyed by LangChain's ``run_id`` (parent:
``parent_run_id``), and the hooks' :class:`~agentbolt.capture.adapters.SpanRecorder` builds and
routes the spans. No context is attached or detached here, and no exception reaches LangChain.
"""

from __future__ import annotations

import contextvars
import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, cast
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.tracers import context as lc_context

from agentbolt import semconv
from agentbolt.capture.adapters import (
    AdapterHooks,
    UnitRecord,
    in_rollout,
    never_raises,
    request_attributes,
    text_attribute,
    tool_call,
    usage_attributes,
)

__all__ = ["HOOK_VAR_NAME", "AgentboltCallbackHandler", "installed_handler"]

HOOK_VAR_NAME = "agentbolt_langchain_handler"
"""Name of the ``ContextVar`` registered with LangChain (how a second copy finds the first)."""

RUN_ID = "langchain.run_id"
LANGGRAPH_NODE = "langgraph.node"
LANGGRAPH_STEP = "langgraph.step"
LANGGRAPH_CONTROL_FLOW = "langgraph.control_flow"

_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool", "function": "function"}
_MAX_CONTENT = 65536


class _Options(Protocol):
    """What the handler reads from the recording adapter (a ``LangChainAdapter``)."""

    agent_names: str
    capture_content: bool


class AgentboltCallbackHandler(AdapterHooks, BaseCallbackHandler):
    """Translates LangChain callbacks into units of the process's recorder (see the module docstring)."""

    run_inline = True  # thread-safe and non-blocking: no executor hop in async callback managers
    raise_error = False

    def __init__(self) -> None:
        super().__init__("langchain")

    def install(self) -> None:
        """Nothing to do: the handler is registered with LangChain once, when created."""

    def uninstall(self) -> None:
        """Nothing to do: the handler stays registered and is inert while no adapter is instrumented."""

    def _options(self) -> _Options | None:
        return cast("_Options | None", self.owner)

    # -- when LangChain dispatches to us ------------------------------------------------------------

    def _ignored(self) -> bool:
        if self.owner is None:
            return True
        return self.recorder.idle() and not in_rollout()

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

    def _ending(self, run_id: UUID) -> _Options | None:
        """The options, when ``run_id`` is a recorded unit about to end (else it is forgotten)."""
        options = self._options()
        if options is None or self.recorder.span_id_of(run_id) is None:
            self.recorder.end(run_id)
            return None
        return options

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
        options = self._options()
        if options is None:
            return
        parent = None  # the nearest recorded ancestor
        try:
            parent = self.recorder.resolve(parent_run_id)
            if parent is None and not in_rollout():
                return
            name = kwargs.get("name") or _serialized_name(serialized) or "chain"
            meta = metadata or {}
            attrs: dict[str, Any] = {RUN_ID: str(run_id)}
            if parent is not None:  # inside a recorded run: only LangGraph node runs become spans
                node = meta.get("langgraph_node")
                if node != name or not isinstance(node, str) or node.startswith("__"):
                    self.recorder.skip(run_id, parent)
                    return
                agent = _node_path(meta, node) if options.agent_names == "path" else node
                attrs[LANGGRAPH_NODE] = node
                attrs[LANGGRAPH_STEP] = meta.get("langgraph_step")
            else:  # the outermost run of this rollout's LangChain work
                agent = str(name)
            attrs[semconv.GEN_AI_AGENT_NAME] = agent
            record = UnitRecord(semconv.KIND_AGENT, f"{semconv.OP_INVOKE_AGENT} {agent}", attrs)
            self.recorder.start(run_id, record, parent_key=parent)
        except Exception as exc:
            self.guard("on_chain_start", exc)
            self.recorder.skip(run_id, parent)

    @never_raises("on_chain_end")
    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.recorder.end(run_id)

    @never_raises("on_chain_error")
    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        if _is_control_flow(error):  # interrupts, Command(graph=PARENT): not failures
            self.recorder.end(run_id, attributes={LANGGRAPH_CONTROL_FLOW: type(error).__name__})
        else:
            self.recorder.end(run_id, error=error)

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

    @never_raises("on_llm_start")
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
        options = self._options()
        if options is None:
            return
        parent = self.recorder.resolve(parent_run_id)
        if parent is None and not in_rollout():
            return
        meta = metadata or {}
        params = kwargs.get("invocation_params") or {}
        model = params.get("model") or params.get("model_name") or meta.get("ls_model_name")
        attrs: dict[str, Any] = {
            RUN_ID: str(run_id),
            semconv.GEN_AI_OPERATION_NAME: operation,
            semconv.GEN_AI_REQUEST_MODEL: model if isinstance(model, str) else None,
            semconv.GEN_AI_SYSTEM: meta.get("ls_provider"),
        }
        defaults = {"temperature": meta.get("ls_temperature"), "max_tokens": meta.get("ls_max_tokens")}
        attrs.update(request_attributes({**defaults, **params}))
        if options.capture_content and inputs:
            first = inputs[0]
            messages = [{"role": "user", "content": first}] if isinstance(first, str) else [_message(m) for m in first]
            attrs[semconv.GEN_AI_INPUT_MESSAGES] = text_attribute(messages, _MAX_CONTENT)
        name = f"{operation} {model}" if isinstance(model, str) and model else operation
        self.recorder.start(run_id, UnitRecord(semconv.KIND_LLM, name, attrs), parent_key=parent)

    @never_raises("on_llm_end")
    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        options = self._ending(run_id)
        if options is None:
            return
        try:
            attrs = _result_attributes(response, options.capture_content)
        except Exception as exc:  # a field we could not read does not lose the span
            self.guard("reading the LLM result", exc)
            attrs = {}
        self.recorder.end(run_id, attributes=attrs)

    @never_raises("on_llm_error")
    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self.recorder.end(run_id, error=error)

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
        options = self._options()
        if options is None:
            return
        parent = None
        try:
            parent = self.recorder.resolve(parent_run_id)
            if parent is None and not in_rollout():
                return
            name = kwargs.get("name") or _serialized_name(serialized) or "tool"
            attrs: dict[str, Any] = {
                RUN_ID: str(run_id),
                semconv.GEN_AI_TOOL_NAME: name,
                semconv.GEN_AI_TOOL_CALL_ID: kwargs.get("tool_call_id"),
            }
            if options.capture_content:
                attrs[semconv.GEN_AI_TOOL_DESCRIPTION] = (serialized or {}).get("description")
                arguments = inputs if inputs is not None else input_str
                attrs[semconv.GEN_AI_TOOL_CALL_ARGUMENTS] = text_attribute(arguments, _MAX_CONTENT)
            record = UnitRecord(semconv.KIND_TOOL, f"{semconv.OP_EXECUTE_TOOL} {name}", attrs)
            self.recorder.start(run_id, record, parent_key=parent)
        except Exception as exc:
            self.guard("on_tool_start", exc)
            self.recorder.skip(run_id, parent)  # runs the tool starts still attach to the nearest recorded run

    @never_raises("on_tool_end")
    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        options = self._ending(run_id)
        if options is None:
            return
        attrs: dict[str, Any] = {}
        error: str | None = None
        try:
            call_id = getattr(output, "tool_call_id", None)  # a ToolMessage
            if isinstance(call_id, str):
                attrs[semconv.GEN_AI_TOOL_CALL_ID] = call_id
            content = getattr(output, "content", output)
            if getattr(output, "status", None) == "error":  # the tool handled its own error
                error = f"tool returned an error: {text_attribute(content, 2000)}"
            if options.capture_content:
                attrs[semconv.GEN_AI_TOOL_CALL_RESULT] = text_attribute(content, _MAX_CONTENT)
        except Exception as exc:  # a field we could not read does not lose the span
            self.guard("reading the tool output", exc)
        self.recorder.end(run_id, attributes=attrs, error=error)

    @never_raises("on_tool_error")
    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        call_id = kwargs.get("tool_call_id")
        attrs = {semconv.GEN_AI_TOOL_CALL_ID: call_id} if isinstance(call_id, str) else None
        self.recorder.end(run_id, attributes=attrs, error=error)


# -- translation helpers ------------------------------------------------------------------------------


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


def _message(message: Any) -> dict[str, Any]:
    """An OpenAI-shaped dict of a LangChain message (role, content, tool calls)."""
    kind = getattr(message, "type", None)
    role = getattr(message, "role", None) if kind == "chat" else _ROLES.get(str(kind), str(kind))
    out: dict[str, Any] = {"role": role, "content": getattr(message, "content", None)}
    calls = getattr(message, "tool_calls", None)
    if calls:
        out["tool_calls"] = [
            tool_call(c.get("id"), c.get("name"), json.dumps(c.get("args"), default=str)) for c in calls
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
    attrs.update(usage_attributes(getattr(message, "usage_metadata", None) or llm_output.get("token_usage")))
    if capture_content and generations:
        messages = [
            _message(g.message) if getattr(g, "message", None) is not None else {"role": "assistant", "content": g.text}
            for g in generations
        ]
        attrs[semconv.GEN_AI_OUTPUT_MESSAGES] = text_attribute(messages, _MAX_CONTENT)
    return attrs


# -- the configure hook -------------------------------------------------------------------------------

_INSTALL_LOCK = threading.Lock()


def installed_handler() -> AgentboltCallbackHandler:
    """The process's handler, registered with LangChain's configure hooks on first use.

    Registered once per process: a hook already registered under :data:`HOOK_VAR_NAME` (by a
    reloaded or second copy of this module) is reused rather than registered again, so runs
    are never recorded twice. The adapter keeps the handler (``LangChainAdapter.shared_hooks()``).
    """
    with _INSTALL_LOCK:
        handler = _registered_handler()
        if handler is None:
            handler = AgentboltCallbackHandler()
            var: contextvars.ContextVar[Any] = contextvars.ContextVar(HOOK_VAR_NAME, default=handler)
            lc_context.register_configure_hook(var, inheritable=True)
        return handler


def _registered_handler() -> AgentboltCallbackHandler | None:
    for entry in getattr(lc_context, "_configure_hooks", ()):
        var = entry[0] if isinstance(entry, tuple) and entry else None
        if var is None or getattr(var, "name", None) != HOOK_VAR_NAME:
            continue
        try:
            handler = contextvars.Context().run(var.get)
        except LookupError:
            continue
        if callable(getattr(handler, "acquire", None)) and callable(getattr(handler, "release", None)):
            return handler
    return None
