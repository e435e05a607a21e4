"""Test helpers for agentbolt and its plugins.

- :mod:`agentbolt.testing.fake_llm`: a fake OpenAI-compatible server with vLLM-style token ids,
  logprobs, streaming, tool calls, latency and injected failures.
- :mod:`agentbolt.testing.store_conformance`, :mod:`~agentbolt.testing.run_conformance`,
  :mod:`~agentbolt.testing.adapter_conformance`, :mod:`~agentbolt.testing.algorithm_conformance`:
  the suites store backends, adapters and algorithms pass (need pytest).
- :mod:`agentbolt.testing.postgres`: a throwaway PostgreSQL server.
- :mod:`agentbolt.testing.requirements`: a test's missing PostgreSQL or browser skips it, or
  fails it in CI (``CI=true``).
- :mod:`agentbolt.testing.outbound`: refuse and record connections that would leave the machine.
- :mod:`agentbolt.testing.hostile`: hostile reward values (overflowing, non-finite, text, bool,
  nested, huge) for tests of reward validation and quarantine.

APO's scripted optimizer LLM is in agentbolt-apo (:mod:`agentbolt_apo.testing`). Submodules
import on demand, so ``import agentbolt.testing`` stays cheap and pytest-free.
"""
