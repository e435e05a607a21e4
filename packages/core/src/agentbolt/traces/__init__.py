"""Improve an agent from its traces: OTLP traces of a deployed, instrumented agent as rollouts.

An agent in production, instrumented with OpenInference, OpenLLMetry or AgentOps and calling a
model agentbolt does not front (a hosted API, your own vLLM), exports its traces over OTLP to
``agentbolt ingest``; each trace (or session) becomes a rollout of a named run:

- :mod:`.grouping`: which rollout a span belongs to, when a trace is complete;
- :mod:`.translation`: the instrumentation adapters' translation, then token ids rebuilt by
  retokenization with the drift check (untrustworthy calls excluded, with the reason);
- :mod:`.rewards`: feedback by trace or session id, judges, a scoring function;
- :mod:`.ingest`: :class:`TraceIngestor`, which does all of it against a store;
- :mod:`.receivers`: the OTLP/HTTP and OTLP/gRPC receivers, feedback and status endpoints.

Traced rollouts are ordinary rollouts: ``run_id`` the run, ``metadata["agentbolt.source"] ==
"trace"`` and ``metadata["agentbolt.trace.key"]`` the trace id (or session); their LLM spans
carry ``gen_ai.input.messages`` / ``gen_ai.output.messages`` and, once retokenized,
``agentbolt.llm.prompt_token_ids`` / ``response_token_ids`` with ``token_source =
"retokenized"``. LightningRL, exports and judges read them like any rollout. See
``docs/traces.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .grouping import GroupState, group_rollout_id
    from .ingest import IngestOptions, TraceIngestor, UnknownTrace
    from .metadata import META_KEY, META_SOURCE
    from .receivers import IngestServer, IngestThread, create_ingest_app
    from .rewards import Scorer, TracedRollout, TraceFeedback
    from .translation import SpanTranslation

__all__ = [
    "META_KEY",
    "META_SOURCE",
    "GroupState",
    "IngestOptions",
    "IngestServer",
    "IngestThread",
    "Scorer",
    "SpanTranslation",
    "TraceFeedback",
    "TraceIngestor",
    "TracedRollout",
    "UnknownTrace",
    "create_ingest_app",
    "group_rollout_id",
]

# FastAPI, grpcio and the adapters are imported on first use.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "GroupState": "grouping",
        "group_rollout_id": "grouping",
        "META_KEY": "metadata",
        "META_SOURCE": "metadata",
        "IngestOptions": "ingest",
        "TraceIngestor": "ingest",
        "UnknownTrace": "ingest",
        "IngestServer": "receivers",
        "IngestThread": "receivers",
        "create_ingest_app": "receivers",
        "Scorer": "rewards",
        "TracedRollout": "rewards",
        "TraceFeedback": "rewards",
        "SpanTranslation": "translation",
    },
)
