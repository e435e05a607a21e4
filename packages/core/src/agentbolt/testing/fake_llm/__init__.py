"""A fake OpenAI-compatible inference server for tests and benchmarks.

It answers ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` from scripted or
rule-based replies and, when asked, returns vLLM-shaped token data: ``return_token_ids: true``
adds ``prompt_token_ids``/``token_ids``, ``logprobs`` adds logprobs. Every id and logprob comes
from :class:`FakeTokenizer` and can be recomputed exactly::

    llm = FakeLLM(rules=[Rule(match="weather", reply=ToolCalls([ToolCall("get_weather", {"city": "Paris"})]))])
    async with FakeLLMServer(llm) as server:           # or `with` (thread), or FakeLLMProcess
        client = AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        r = await client.chat.completions.create(
            model="fake-model", messages=messages, logprobs=True, extra_body={"return_token_ids": True}
        )
    tok = FakeTokenizer()
    prompt_ids = tok.render_chat(messages)                       # == r.prompt_token_ids
    response_ids = tok.encode(r.choices[0].message.content)      # == r.choices[0].token_ids
    logprobs = tok.expected_logprobs(prompt_ids, response_ids)   # == [e.logprob for e in ...content]

Failures (5xx, hangs, dropped connections, mid-stream drops) are injected with
:class:`Failure`; every request is recorded in :attr:`FakeLLM.requests`.
"""

from __future__ import annotations

from .app import FakeLLMApp
from .backend import FakeLLM
from .config import DEFAULT_MODEL, DEFAULT_REPLY, Failure, FakeLLMConfig, Rule, ToolCall, ToolCalls
from .request_log import FakeRequest, RecordedRequest, RequestLog
from .server import FakeLLMProcess, FakeLLMServer, RemoteRequestLog
from .tokenizer import FakeTokenizer, expected_logprobs

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_REPLY",
    "Failure",
    "FakeLLM",
    "FakeLLMApp",
    "FakeLLMConfig",
    "FakeLLMProcess",
    "FakeLLMServer",
    "FakeRequest",
    "FakeTokenizer",
    "RecordedRequest",
    "RemoteRequestLog",
    "RequestLog",
    "Rule",
    "ToolCall",
    "ToolCalls",
    "expected_logprobs",
]
