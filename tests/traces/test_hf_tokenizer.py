"""Retokenization of traced calls with a real Hugging Face tokenizer and chat template (the tiny
one agentbolt-torch builds offline): the ids a vLLM serving that model would count pass the drift
check; a provider that counts with another tokenizer fails it, and the call is excluded."""

from __future__ import annotations

from typing import Any

import pytest

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.store import open_store
from agentbolt.traces import SpanTranslation, TraceIngestor

models = pytest.importorskip("agentbolt_torch.models")


def llm_span(trace: str, span: str, question: str, answer: str, prompt_tokens: int, completion_tokens: int) -> t.Span:
    attrs: dict[str, Any] = {
        "openinference.span.kind": "LLM",
        "llm.input_messages.0.message.role": "user",
        "llm.input_messages.0.message.content": question,
        "llm.output_messages.0.message.role": "assistant",
        "llm.output_messages.0.message.content": answer,
        "llm.finish_reason": "stop",
        "llm.token_count.prompt": prompt_tokens,
        "llm.token_count.completion": completion_tokens,
    }
    return t.Span.create("ChatCompletion", trace_id=trace, span_id=span, attributes=attrs)


async def test_a_chat_template_tokenizer_rebuilds_what_the_server_counted_and_flags_what_it_did_not() -> None:
    tok = models.tiny_tokenizer()
    question, answer = "What is 2 + 3?", "It is 5."
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    prompt_ids = tok.encode(prompt, add_special_tokens=False)
    response_ids = [
        *tok.encode(answer, add_special_tokens=False),
        tok.eos_token_id,
    ]  # a server samples EOS and counts it
    served = llm_span("a" * 32, "1" * 16, question, answer, len(prompt_ids), len(response_ids))
    other = llm_span("b" * 32, "2" * 16, question, answer, len(prompt_ids) + 7, len(response_ids))  # another template
    ing = TraceIngestor(open_store("memory://"), "prod", translation=SpanTranslation(tok))
    await ing.start(keeper=False)
    await ing.ingest([served, other])
    await ing.complete_all()
    rows = {r["key"]: r for r in ing.status()}
    assert (rows["a" * 32]["retokenized"], rows["a" * 32]["excluded"]) == (1, {})
    assert rows["b" * 32]["excluded"] == {"token_drift": 1}
    spans = await ing.store.query_spans([f"prod:trace:{'a' * 32}", f"prod:trace:{'b' * 32}"])
    (good,) = spans[f"prod:trace:{'a' * 32}"]
    assert good.attributes[semconv.PROMPT_TOKEN_IDS] == prompt_ids
    assert good.attributes[semconv.RESPONSE_TOKEN_IDS] == response_ids
    (bad,) = spans[f"prod:trace:{'b' * 32}"]
    assert bad.attributes[semconv.TOKEN_DRIFT] == (
        f"prompt: {len(prompt_ids)} tokens retokenized, the backend reported {len(prompt_ids) + 7}"
    )
