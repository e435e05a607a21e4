"""Retokenization: token ids rebuilt from text, for backends that return none — checked, never silent.

Exact ids (the backend's own, ``token_source = "exact"``) are what training should use. A hosted
API, SGLang, llama.cpp or an older vLLM returns text only; with
``Trainer(..., capture=CaptureOptions(token_ids="retokenize", tokenizer="HuggingFaceTB/SmolLM2-135M-Instruct"))`` the
gateway renders each such call's messages with the policy's tokenizer and chat template
(:class:`ChatTemplateRetokenizer`) and records ``token_source = "retokenized"``.

Each retokenized call is checked against what the backend reported (:func:`drift_reasons`):

- ``usage.prompt_tokens`` must equal the number of rebuilt prompt ids (a different chat
  template, system prompt injection or truncation shows up here);
- ``usage.completion_tokens`` must equal the number of rebuilt response ids (the reply
  tokenized differently from how it was sampled);
- the rebuilt response ids must decode back to the reply's text.

A call that fails a check carries ``agentbolt.llm.token_drift`` (the reasons) and LightningRL
excludes it (``token_drift``) even when retokenized calls are allowed; ``agentbolt doctor``
counts them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from .roles import content_text

__all__ = ["ChatTemplateRetokenizer", "drift_reasons"]

log = logging.getLogger(__name__)


def drift_reasons(
    response: Mapping[str, Any],
    prompt_ids: Sequence[int],
    response_ids: Sequence[int],
    decode: Callable[[Sequence[int]], str] | None = None,
) -> list[str]:
    """Why rebuilt ids disagree with what the backend reported (empty: they agree)."""
    reasons = []
    usage = response.get("usage") or {}
    reported_prompt, reported_completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(reported_prompt, int) and reported_prompt != len(prompt_ids):
        reasons.append(f"prompt: {len(prompt_ids)} tokens retokenized, the backend reported {reported_prompt}")
    if isinstance(reported_completion, int) and reported_completion != len(response_ids):
        reasons.append(f"response: {len(response_ids)} tokens retokenized, the backend reported {reported_completion}")
    choices = response.get("choices") or []
    message = (choices[0].get("message") or {}) if choices else {}
    if decode is not None and message.get("content") and not message.get("tool_calls"):
        text = content_text(message["content"])
        back = decode(list(response_ids))
        if back.strip() != text.strip():
            reasons.append(f"text round trip: the ids decode to {back[:60]!r}, the reply was {text[:60]!r}")
    return reasons


class ChatTemplateRetokenizer:
    """Rebuilds a call's ids with the policy's tokenizer: ``(request, response) -> (prompt_ids, response_ids)``.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template (``apply_chat_template``), or
            an object with ``render_chat(messages, tools)`` / ``encode`` / ``decode`` (as
            :class:`agentbolt.testing.fake_llm.FakeTokenizer`).
        eos_on_stop: append the tokenizer's EOS id to replies that ended with ``finish_reason
            = "stop"`` (what vLLM-style backends sample and count; default: when the tokenizer
            has an EOS token and a chat template).
    """

    def __init__(self, tokenizer: Any, *, eos_on_stop: bool | None = None) -> None:
        self.tokenizer = tokenizer
        self._hf = hasattr(tokenizer, "apply_chat_template")
        if not self._hf and not hasattr(tokenizer, "render_chat"):
            raise TypeError(
                f"{type(tokenizer).__name__} has neither apply_chat_template (a Hugging Face tokenizer) "
                "nor render_chat: pass the policy's tokenizer"
            )
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_id: int | None = eos if isinstance(eos, int) else None
        self.eos_on_stop = (self._hf and self.eos_id is not None) if eos_on_stop is None else eos_on_stop

    @classmethod
    def from_pretrained(cls, name_or_path: str, **kwargs: Any) -> ChatTemplateRetokenizer:
        """The tokenizer of a Hugging Face model (``transformers.AutoTokenizer``)."""
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(name_or_path), **kwargs)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of response ids, special tokens skipped (the text round trip)."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def _encode(self, text: str) -> list[int]:
        if self._hf:
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        return list(self.tokenizer.encode(text))

    def _render(self, messages: list[Any], tools: Any, generation: bool) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                messages, tools=tools or None, tokenize=False, add_generation_prompt=generation
            )
        )

    def __call__(self, request: Mapping[str, Any], response: Mapping[str, Any]) -> tuple[list[int], list[int]] | None:
        choices = response.get("choices") or []
        if not choices:
            return None
        choice = choices[0]
        messages = request.get("messages")
        if messages is None:  # text completion
            prompt = request.get("prompt")
            if not isinstance(prompt, str):
                return None
            return self._encode(prompt), self._encode(str(choice.get("text") or ""))
        tools = request.get("tools")
        message = choice.get("message") or {}
        calls = message.get("tool_calls") or []
        content = content_text(message.get("content"))
        if not self._hf:
            prompt_ids = list(self.tokenizer.render_chat(messages, tools))
            response_ids = self._encode(content)
            if calls:
                pairs = [(c["function"]["name"], c["function"].get("arguments") or "") for c in calls]
                response_ids += self.tokenizer.render_tool_calls(pairs, after_content=bool(content))
        else:
            prompt_text = self._render(list(messages), tools, True)
            prompt_ids = self._encode(prompt_text)
            if calls:  # the template's rendering of the tool calls: the full chat minus the prompt
                reply = {"role": "assistant", "content": content or None, "tool_calls": _parsed_calls(calls)}
                full = self._render([*messages, reply], tools, False)
                if not full.startswith(prompt_text):
                    return prompt_ids, self._encode(content)  # drift check flags the count
                tail = full[len(prompt_text) :]
                eos = getattr(self.tokenizer, "eos_token", None)
                if isinstance(eos, str) and eos in tail:
                    tail = tail[: tail.index(eos)]
                response_ids = self._encode(tail)
            else:
                response_ids = self._encode(content)
        if self.eos_on_stop and self.eos_id is not None and choice.get("finish_reason") in ("stop", "tool_calls"):
            response_ids.append(self.eos_id)
        return prompt_ids, response_ids


def _parsed_calls(calls: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Tool calls with JSON-decoded arguments (what chat templates expect)."""
    out = []
    for c in calls:
        fn = c.get("function") or {}
        try:
            arguments = orjson.loads(fn.get("arguments") or "{}")
        except orjson.JSONDecodeError:
            arguments = fn.get("arguments")
        out.append(
            {"id": c.get("id"), "type": "function", "function": {"name": fn.get("name"), "arguments": arguments}}
        )
    return out
