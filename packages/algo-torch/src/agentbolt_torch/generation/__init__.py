"""Generation: the protocol every generator implements (:mod:`.generator`), the continuous-batching engine (:mod:`.engine`), what goes in and out of it
(:mod:`.engine_io`), the sampling of a batch (:mod:`.sampling`), its KV-cache helpers
(:mod:`._kv`), incremental detokenization (:mod:`.token_text`) and the serving copy of the weights
for asynchronous training (:mod:`.serving_copy`)."""

from __future__ import annotations

from agentbolt._lazy import lazy_exports

__all__ = ["Completion", "GenerationEngine", "Generator", "SamplingParams"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {"Completion": "engine_io", "GenerationEngine": "engine", "Generator": "generator", "SamplingParams": "engine_io"},
)
