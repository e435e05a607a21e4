"""Test helpers for agentbolt and its plugins.

- :mod:`agentbolt.testing.fake_llm`: a fake OpenAI-compatible server with vLLM-style token ids,
  logprobs, streaming, tool calls, latency and injected failures.
- :mod:`agentbolt.testing.fake_optimizer`: a scripted optimizer LLM answering APO's critique and
  edit requests (on top of the fake server).
- :mod:`agentbolt.testing.store_conformance`: the suite every store backend passes (needs pytest).
- :mod:`agentbolt.testing.postgres`: a throwaway PostgreSQL server.
- :mod:`agentbolt.testing.outbound`: refuse and record connections that would leave the machine.

Submodules import on demand, so ``import agentbolt.testing`` stays cheap and pytest-free.
"""
