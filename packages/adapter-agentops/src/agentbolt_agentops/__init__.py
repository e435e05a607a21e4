"""agentbolt-agentops: agents instrumented with AgentOps train under agentbolt unchanged, nothing
reaches AgentOps' cloud without an API key, and their spans give LightningRL its structure.

Runners instrument the adapter automatically when this package is installed; to do it by
hand (a notebook, a custom runner)::

    from agentbolt_agentops import AgentOpsAdapter

    adapter = AgentOpsAdapter()
    adapter.instrument()      # idempotent; uninstrument() undoes it

``AgentOpsTracerAdapter`` (registered as ``"agentops-tracer"``, opt-in:
``Trainer(..., adapters=["agentops-tracer"])``) also initializes AgentOps in the runner, as the
reference system's default tracer did, so that agents which never call ``agentops.init()`` get
AgentOps' auto-instrumentation (LLM clients, CrewAI, Agno, smolagents, LangGraph...).

Importing this package is cheap: AgentOps is imported only when the tracer is instrumented.
"""

from __future__ import annotations

from agentbolt.plugins import distribution_version

from .adapter import AgentOpsAdapter, AgentOpsTracerAdapter

__version__ = distribution_version("agentbolt-agentops")

__all__ = ["AgentOpsAdapter", "AgentOpsTracerAdapter", "__version__"]
