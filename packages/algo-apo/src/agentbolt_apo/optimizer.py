"""The optimizer LLM of APO: its client, the critique and edit requests, and reading its answers.

APO asks an optimizer model two things (the "textual gradient" of the paper's method):

1. **critique**: here is the prompt and the tasks it failed (inputs, the agent's outputs, the
   rewards): what is wrong with the prompt? The answer is free text.
2. **edit**: here is the prompt and a critique of it: write an improved prompt. The answer must
   hold the new prompt between ``<prompt>`` and ``</prompt>``; an answer without one (or with an
   empty one) is *malformed*: :func:`parse_edited_prompt` returns ``None`` and APO skips that
   candidate.

Any OpenAI-compatible ``/chat/completions`` endpoint serves (OpenAI, vLLM, Ollama, agentbolt-torch's
policy server). The client is plain httpx: core does not depend on the ``openai`` package.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from agentbolt.errors import UserError

__all__ = [
    "CRITIQUE_SYSTEM",
    "EDIT_SYSTEM",
    "Failure",
    "OptimizerClient",
    "OptimizerError",
    "critique_messages",
    "edit_messages",
    "extract_tag",
    "parse_edited_prompt",
    "placeholders",
    "request_kind",
]

log = logging.getLogger(__name__)

CRITIQUE_SYSTEM = (
    "You improve the prompts of an AI agent. You are shown the agent's current prompt and tasks on which the agent "
    "did badly: each task's input, what the agent answered, and the reward it got (higher is better). Explain "
    "concisely what in the prompt causes these failures and what the prompt should say instead. Do not write the "
    "new prompt yet."
)
EDIT_SYSTEM = (
    "You improve the prompts of an AI agent. You are shown the agent's current prompt and a critique of it. Write "
    "an improved prompt that fixes what the critique points out. Keep every placeholder in curly braces exactly as "
    "it is. Answer with the complete new prompt between <prompt> and </prompt>, and nothing after it."
)

_MAX_FIELD_CHARS = 1500
"""Each task input or output shown to the optimizer is cut to this many characters."""


@dataclass(frozen=True)
class Failure:
    """A task the prompt did badly on, as the critique request shows it."""

    task_id: str
    input: Any
    """The task's input (JSON)."""
    output: str
    """What the agent answered: its last LLM reply, or the error of a failed rollout."""
    reward: float | None
    """The rollout's reward (``None``: it reported none or failed)."""


def _clip(text: str, limit: int = _MAX_FIELD_CHARS) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... [{len(text) - limit} more characters]"


def critique_messages(prompt: str, failures: Sequence[Failure]) -> list[dict[str, str]]:
    """The chat messages asking for a critique of ``prompt`` from ``failures``."""
    blocks = []
    for i, f in enumerate(failures, 1):
        task_input = f.input if isinstance(f.input, str) else json.dumps(f.input, ensure_ascii=False, default=str)
        reward = "none (failed or no reward reported)" if f.reward is None else f"{f.reward:.3g}"
        blocks.append(
            f"<task index={i} id={f.task_id!r}>\n<input>\n{_clip(task_input)}\n</input>\n"
            f"<output>\n{_clip(f.output)}\n</output>\n<reward>{reward}</reward>\n</task>"
        )
    user = f"<prompt>\n{prompt}\n</prompt>\n\n<failures>\n" + "\n".join(blocks) + "\n</failures>"
    return [{"role": "system", "content": CRITIQUE_SYSTEM}, {"role": "user", "content": user}]


def edit_messages(prompt: str, critique: str) -> list[dict[str, str]]:
    """The chat messages asking for an edited ``prompt`` that answers ``critique``."""
    user = f"<prompt>\n{prompt}\n</prompt>\n\n<critique>\n{critique}\n</critique>"
    return [{"role": "system", "content": EDIT_SYSTEM}, {"role": "user", "content": user}]


def extract_tag(text: str, tag: str) -> str | None:
    """The stripped text of the first ``<tag>...</tag>`` in ``text`` (``None`` when absent)."""
    match = re.search(rf"<{tag}(?:\s[^>]*)?>(.*?)</{tag}>", text, flags=re.DOTALL)
    return match.group(1).strip() if match else None


def request_kind(messages: Sequence[dict[str, Any]]) -> Literal["critique", "edit"] | None:
    """Which APO request ``messages`` are (for fake optimizers in tests), ``None`` for neither."""
    system = next((m.get("content") for m in messages if m.get("role") == "system"), None)
    if system == CRITIQUE_SYSTEM:
        return "critique"
    if system == EDIT_SYSTEM:
        return "edit"
    return None


def parse_edited_prompt(answer: str) -> str | None:
    """The new prompt in an edit answer, or ``None`` when the answer holds none (no
    ``<prompt>...</prompt>``, or an empty one)."""
    prompt = extract_tag(answer, "prompt")
    return prompt or None


_PLACEHOLDER = re.compile(r"\{\{\s*[A-Za-z_][\w.]*\s*\}\}|\{[A-Za-z_]\w*\}")


def placeholders(prompt: str) -> set[str]:
    """The template placeholders in ``prompt`` (``{name}`` and ``{{ name }}``), whitespace removed."""
    return {re.sub(r"\s", "", m) for m in _PLACEHOLDER.findall(prompt)}


class OptimizerError(Exception):
    """An optimizer answer APO cannot use (no text in it); the candidate it was for is skipped."""


class OptimizerClient:
    """Chat completions from the optimizer endpoint.

    Args:
        base_url: the OpenAI-compatible base URL (``.../v1``).
        model: the model name sent with each request.
        api_key_env: the environment variable holding the API key (``None``: send no key). An
            unset variable sends no key, as local servers need none; a 401/403 answer then names it.
        temperature: sampling temperature (diverse edits need some).
        timeout_s: seconds to wait for one answer.
        retries: further tries after a 429/5xx answer or a dropped connection.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str | None = "OPENAI_API_KEY",
        temperature: float = 1.0,
        timeout_s: float = 120.0,
        retries: int = 2,
        max_tokens: int | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.temperature = temperature
        self.timeout_s = timeout_s
        self.retries = retries
        self.max_tokens = max_tokens
        self.calls = 0
        self._client: httpx.AsyncClient | None = None

    @property
    def url(self) -> str:
        """The chat completions URL."""
        return f"{self.base_url}/chat/completions"

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def complete(self, messages: Sequence[dict[str, str]]) -> str:
        """The text of the optimizer's answer to ``messages``.

        Raises :class:`~agentbolt.errors.UserError` when the endpoint cannot be reached or refuses
        the request (the message names the URL and the key's variable), and :class:`OptimizerError`
        for an answer with no text (APO skips that candidate).
        """
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s)
        body: dict[str, Any] = {"model": self.model, "messages": list(messages), "temperature": self.temperature}
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        self.calls += 1
        response = await self._post(body)
        try:
            data = response.json()
            content = data["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise OptimizerError(
                f"the optimizer's answer is not a chat completion ({exc!r}): {response.text[:300]}"
            ) from exc
        if not isinstance(content, str) or not content.strip():
            raise OptimizerError("the optimizer answered no text")
        return content

    async def _post(self, body: dict[str, Any]) -> httpx.Response:
        assert self._client is not None
        key_hint = (
            f"the API key is read from ${self.api_key_env}"
            + ("" if self.api_key_env and os.environ.get(self.api_key_env) else " (unset)")
            if self.api_key_env
            else "no API key is sent (optimizer_api_key_env=None)"
        )
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = await self._client.post(self.url, json=body, headers=self._headers())
            except httpx.TransportError as exc:
                if isinstance(exc, httpx.ConnectError) or last:
                    raise UserError(
                        f"the APO optimizer endpoint {self.url} cannot be reached ({type(exc).__name__}: {exc}); "
                        "start that server or set optimizer_base_url to a running OpenAI-compatible endpoint"
                    ) from exc
                log.warning("optimizer request to %s failed (%s); retrying", self.url, exc)
            else:
                if response.status_code in (401, 403):
                    raise UserError(
                        f"the APO optimizer endpoint {self.url} refused the request ({response.status_code}): "
                        f"{key_hint}; set it to a valid key"
                    )
                if response.status_code == 404:
                    raise UserError(
                        f"the APO optimizer endpoint {self.url} answered 404 for model {self.model!r}: check "
                        f"optimizer_base_url (it ends in /v1) and optimizer_model ({response.text[:200]})"
                    )
                if response.status_code < 400:
                    return response
                if (response.status_code != 429 and response.status_code < 500) or last:
                    raise UserError(
                        f"the APO optimizer endpoint {self.url} answered {response.status_code}: {response.text[:300]}"
                    )
                log.warning("optimizer answered %d; retrying", response.status_code)
            await asyncio.sleep(min(2.0**attempt, 10.0))
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None
