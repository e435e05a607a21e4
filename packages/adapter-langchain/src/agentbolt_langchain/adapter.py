"""The LangChain / LangGraph adapter (importing this module does not import LangChain)."""

from __future__ import annotations

import importlib.metadata
from typing import TYPE_CHECKING, Literal

from agentbolt.capture.adapters import Adapter, check_distribution
from agentbolt.errors import UserError

if TYPE_CHECKING:
    from ._handler import AgentboltCallbackHandler

__all__ = ["LangChainAdapter"]

AgentNames = Literal["node", "path"]


class LangChainAdapter(Adapter):
    """Records LangChain and LangGraph runs of the current rollout as agentbolt spans.

    Instrumenting installs one callback handler through LangChain's official configure hook
    (``langchain_core.tracers.context.register_configure_hook``), so every ``invoke`` /
    ``ainvoke`` / ``stream`` sees it without a ``callbacks=`` argument. The handler records
    only runs that start while a rollout is current (``agentbolt.capture.tracing.current_rollout()``),
    or under a run that did.

    What becomes a span:

    - the outermost run of a rollout (a graph's or chain's ``invoke``) and every LangGraph node
      run → an agent span (``gen_ai.agent.name`` = the node name, or the run name for the
      outermost run);
    - every chat-model call → an LLM span whose ``gen_ai.response.id`` is the provider's
      response id, which joins it to the gateway's span (exact token ids);
    - every tool run → a tool span (``gen_ai.tool.name``, ``gen_ai.tool.call.id``), status
      ERROR when the tool raised or returned an error ``ToolMessage``.

    Other chain runs (``RunnableSequence``, ``RunnableLambda``, conditional-edge functions,
    a subgraph's own run inside its node, ...) are not recorded; their children attach to the
    nearest recorded ancestor.

    Args:
        agent_names: ``"node"`` names an agent span after its LangGraph node; ``"path"``
            after the path of nodes from the outermost graph (``"writer/model"`` for the
            ``model`` node of a subgraph run by the ``writer`` node), which tells apart agents
            built from the same prebuilt graph.
        capture_content: also record chat messages (``gen_ai.input.messages`` /
            ``gen_ai.output.messages``) and tool arguments and results on the spans. Off by
            default: the gateway already records every request and response body.

    Several instances may be instrumented at once; only the first records (the others stand
    by and take over, in order, when it is uninstrumented), so nothing is recorded twice.
    """

    name = "langchain"
    distribution = "langchain-core"
    supported = ">=1.0,<2"
    langgraph_supported = ">=1.0,<2"
    """Versions of ``langgraph`` the node naming is written for (checked when installed)."""

    def __init__(self, *, agent_names: AgentNames = "node", capture_content: bool = False) -> None:
        if agent_names not in ("node", "path"):
            raise UserError(f"agent_names must be 'node' or 'path', got {agent_names!r}")
        super().__init__()
        self.agent_names: AgentNames = agent_names
        self.capture_content = bool(capture_content)

    def check_version(self) -> str:
        """The installed langchain-core version; raises a clear error when missing or
        unsupported (and when an installed ``langgraph`` is outside :attr:`langgraph_supported`)."""
        installed = super().check_version()
        try:
            importlib.metadata.version("langgraph")
        except importlib.metadata.PackageNotFoundError:
            return installed  # plain LangChain works without LangGraph
        check_distribution("langgraph", self.langgraph_supported, f"the {self.name} adapter")
        return installed

    @classmethod
    def make_hooks(cls) -> AgentboltCallbackHandler:
        from ._handler import installed_handler

        return installed_handler()

    @property
    def recording(self) -> bool:
        """True when this instance is the one recording (instrumented and first in line)."""
        return self.instrumented and self.hooks.owner is self
