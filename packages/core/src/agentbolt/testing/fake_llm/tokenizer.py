"""A deterministic, reversible, stateless tokenizer and the fake model's "probabilities".

Every piece of the fake server's token data comes from here, so tests (the gateway's, the
trainer's) can recompute exactly what the server returned.

Token ids (all below 2**31):

- ``0..15``: special tokens; ``<|endoftext|>`` = 0, ``<|im_start|>`` = 1, ``<|im_end|>`` = 2.
- ``16 + ord(c)``: one character ``c`` (any code point that is not part of a word piece).
- ``WORD_BASE + 2 * n + s``: a *word piece*: an optional leading space (``s = 1``) and one to
  four characters of ``[0-9A-Za-z_]``; ``n`` encodes the characters in bijective base 64.

Encoding splits text into runs of ``' ?[0-9A-Za-z_]+'`` (cut into pieces of at most four word
characters; the leading space rides on the first piece) and single other characters, so
``"Hello, world"`` is ``["Hell", "o", ",", " wor", "ld"]``. Each token decodes on its own to a
whole string (no partial UTF-8), so ``decode(ids) == "".join(decode([i]) for i in ids)`` and
``decode(encode(s)) == s`` for every string.

The chat template is ChatML-like; the content of each message is encoded on its own, so the
response ids of one call reappear verbatim in the next call's prompt (the prompt of turn 2
extends ``prompt_ids + response_ids`` of turn 1, as trajectory merging expects).

Logprobs: the fake model is greedy. The chosen token at ``position`` of a response to
``prompt_ids`` has logprob ``-k / 1024`` with ``k`` in ``1..1024`` given by a hash of
(prompt, position, token); its alternatives share the remaining probability mass, halving each
rank, so ``top_logprobs`` is sorted, starts with the chosen token and sums to at most 1.
"""

from __future__ import annotations

import functools
import math
import re
import zlib
from array import array
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import orjson

__all__ = [
    "CHAR_BASE",
    "ENDOFTEXT",
    "IM_END",
    "IM_START",
    "WORD_BASE",
    "FakeTokenizer",
    "content_text",
    "expected_logprobs",
    "prompt_key",
    "token_logprob",
    "top_logprobs",
]

ENDOFTEXT: Final = 0
"""``<|endoftext|>``."""
IM_START: Final = 1
"""``<|im_start|>``: opens a message in the chat template."""
IM_END: Final = 2
"""``<|im_end|>``: closes a message; the end-of-sequence token when ``FakeLLM(eos_token=True)``."""
_SPECIALS: Final = {ENDOFTEXT: "<|endoftext|>", IM_START: "<|im_start|>", IM_END: "<|im_end|>"}

CHAR_BASE: Final = 16
"""Id of the character with code point 0; character ``c`` is ``CHAR_BASE + ord(c)``."""
WORD_BASE: Final = CHAR_BASE + 0x110000
"""First word-piece id."""
_MAX_PIECE: Final = 4
_ALPHABET: Final = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_"
_DIGIT: Final = {c: i + 1 for i, c in enumerate(_ALPHABET)}  # bijective base 64: digits 1..63
_MAX_WORD_ID: Final = WORD_BASE + 2 * (64**_MAX_PIECE) - 1
_SPLIT: Final = re.compile(r" ?[0-9A-Za-z_]+|.", re.DOTALL)

_LN2: Final = math.log(2.0)
_M64: Final = (1 << 64) - 1
_ALT_TEXTS: Final = (" the", ",", " a", ".", " and", " of", " to", "\n", " is", " in", " that", " it")


def _mix64(x: int) -> int:
    """splitmix64 finalizer: a fast, well-mixed 64-bit hash of an integer."""
    x &= _M64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


@functools.lru_cache(maxsize=1 << 16)
def _word_id(piece: str) -> int:
    space = piece[0] == " "
    n = 0
    for c in reversed(piece[1:] if space else piece):
        n = n * 64 + _DIGIT[c]
    return WORD_BASE + 2 * n + space


@functools.lru_cache(maxsize=1 << 16)
def _encode(text: str) -> tuple[int, ...]:
    out: list[int] = []
    for run in _SPLIT.findall(text):
        if len(run) == 1 and run not in _DIGIT:
            out.append(CHAR_BASE + ord(run))
            continue
        start = 1 if run[0] == " " else 0
        end = start + _MAX_PIECE
        out.append(_word_id(run[:end]))
        for i in range(end, len(run), _MAX_PIECE):
            out.append(_word_id(run[i : i + _MAX_PIECE]))
    return tuple(out)


@functools.lru_cache(maxsize=1 << 16)
def _decode_one(token_id: int) -> str:
    if token_id >= WORD_BASE:
        if token_id > _MAX_WORD_ID:
            raise ValueError(f"token id {token_id} is not in the fake vocabulary")
        n, space = divmod(token_id - WORD_BASE, 2)
        chars = []
        while n:
            n, d = divmod(n, 64)
            if d == 0:
                raise ValueError(f"token id {token_id} is not in the fake vocabulary")
            chars.append(_ALPHABET[d - 1])
        if not chars or len(chars) > _MAX_PIECE:
            raise ValueError(f"token id {token_id} is not in the fake vocabulary")
        return (" " if space else "") + "".join(chars)
    if token_id >= CHAR_BASE:
        return chr(token_id - CHAR_BASE)
    special = _SPECIALS.get(token_id)
    if special is None:
        raise ValueError(f"token id {token_id} is not in the fake vocabulary")
    return special


def content_text(content: Any) -> str:
    """The text of a message's ``content``: a string, ``None`` (empty), or a list of parts.

    Text parts contribute their ``text``; any other part (an image, audio) renders as
    ``<{type}>``.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping):
                kind = part.get("type", "text")
                parts.append(str(part.get("text", "")) if kind == "text" else f"<{kind}>")
            else:
                parts.append(str(part))
        return "".join(parts)
    return str(content)


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def prompt_key(prompt_ids: Sequence[int]) -> int:
    """A 32-bit fingerprint of a prompt (CRC-32 of its ids as little-endian int64)."""
    buf = array("q", prompt_ids)
    if buf.itemsize != 8:  # pragma: no cover - every supported platform has 8-byte "q"
        raise RuntimeError("array('q') is not 64-bit on this platform")
    return zlib.crc32(buf.tobytes())


def token_logprob(key: int, position: int, token_id: int) -> float:
    """Logprob of ``token_id`` chosen at ``position`` (0 = first response token) after the prompt
    whose :func:`prompt_key` is ``key``: ``-k / 1024`` with ``k`` in ``1..1024``, exact in binary."""
    h = _mix64(key ^ _mix64(position * 0x9E3779B97F4A7C15 + token_id))
    return -float((h & 1023) + 1) / 1024.0


def top_logprobs(key: int, position: int, token_id: int, k: int) -> list[tuple[int, float]]:
    """The ``k`` most likely tokens at ``position``, best first: the chosen token, then
    alternatives whose probabilities are ``(1 - p) / 2``, ``(1 - p) / 4``, ... (``p`` that of
    the chosen token). Returns ``(token_id, logprob)`` pairs; empty when ``k <= 0``."""
    if k <= 0:
        return []
    lp = token_logprob(key, position, token_id)
    out = [(token_id, lp)]
    if k == 1:
        return out
    rest = math.log1p(-math.exp(lp))
    start = _mix64(key + position) % len(_ALT_IDS)
    rank = 1
    for i in range(len(_ALT_IDS)):
        if rank >= k:
            break
        alt = _ALT_IDS[(start + i) % len(_ALT_IDS)]
        if alt == token_id:
            continue
        out.append((alt, rest - rank * _LN2))
        rank += 1
    return out


def expected_logprobs(prompt_ids: Sequence[int], response_ids: Sequence[int]) -> list[float]:
    """The logprob the fake server reports for each of ``response_ids`` after ``prompt_ids``."""
    key = prompt_key(prompt_ids)
    return [token_logprob(key, i, t) for i, t in enumerate(response_ids)]


class FakeTokenizer:
    """The fake model's tokenizer and chat template (stateless; every instance is equivalent).

    ``encode``/``decode`` are exact inverses on text; ``render_chat`` gives the prompt ids the
    server reports as ``prompt_token_ids``; ``render_tool_calls`` gives the response ids of a
    tool-call reply; ``expected_logprobs`` recomputes the logprobs the server reports.
    """

    eos_token_id: int = IM_END
    """Appended to a response that ends naturally when ``FakeLLM(eos_token=True)``."""
    vocab_size: int = _MAX_WORD_ID + 1
    """One more than the largest token id."""

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (never adds special tokens)."""
        return list(_encode(text))

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; special tokens render as ``<|...|>`` unless skipped.

        Raises:
            ValueError: an id outside the fake vocabulary.
        """
        if skip_special_tokens:
            return "".join(_decode_one(i) for i in ids if i >= CHAR_BASE)
        return "".join(_decode_one(i) for i in ids)

    def token_text(self, token_id: int) -> str:
        """Text of one token (what logprob entries and stream deltas show)."""
        return _decode_one(token_id)

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """Prompt ids of a chat request.

        Layout (each ``{...}`` encoded on its own)::

            <|im_start|>tools\\n{tool JSON, sorted keys}\\n{tool JSON}<|im_end|>\\n   (only with tools)
            <|im_start|>{role}[ name={name}]\\n{content}{tool calls}<|im_end|>\\n       (each message)
            <|im_start|>assistant\\n                                                    (generation prompt)

        ``{tool calls}`` of an assistant message are rendered as by :meth:`render_tool_calls`.
        """
        ids: list[int] = []
        if tools:
            ids.append(IM_START)
            ids += _encode("tools\n")
            for i, tool in enumerate(tools):
                if i:
                    ids += _encode("\n")
                ids += _encode(_json(tool))
            ids.append(IM_END)
            ids += _encode("\n")
        for message in messages:
            role = str(message.get("role", ""))
            name = message.get("name")
            ids.append(IM_START)
            ids += _encode(f"{role} name={name}\n" if name else f"{role}\n")
            content = content_text(message.get("content"))
            ids += _encode(content)
            calls = message.get("tool_calls")
            if calls:
                ids += self.render_tool_calls(
                    [(c["function"]["name"], c["function"].get("arguments") or "") for c in calls],
                    after_content=bool(content),
                )
            ids.append(IM_END)
            ids += _encode("\n")
        if add_generation_prompt:
            ids.append(IM_START)
            ids += _encode("assistant\n")
        return ids

    def render_chat_text(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> str:
        """``decode(render_chat(...))``: the prompt as text, for reading and debugging."""
        return self.decode(self.render_chat(messages, tools, add_generation_prompt=add_generation_prompt))

    def tool_call_segments(self, name: str, arguments: str, *, first: bool = True) -> tuple[str, str, str]:
        """The three texts one tool call renders to: ``(head, arguments, tail)``.

        ``head`` is ``<tool_call>\\n{"name": NAME, "arguments": `` (preceded by a newline unless
        ``first``), ``tail`` is ``}\\n</tool_call>``; each is encoded on its own.
        """
        head = ("" if first else "\n") + '<tool_call>\n{"name": ' + orjson.dumps(name).decode() + ', "arguments": '
        return head, arguments, "}\n</tool_call>"

    def render_tool_calls(self, calls: Iterable[tuple[str, str]], *, after_content: bool = False) -> list[int]:
        """Response ids of tool calls given as ``(name, arguments JSON string)`` pairs.

        A reply's ids are ``encode(content) + render_tool_calls(calls, after_content=bool(content))``.
        """
        ids: list[int] = []
        for i, (name, arguments) in enumerate(calls):
            for segment in self.tool_call_segments(name, arguments, first=i == 0 and not after_content):
                ids += _encode(segment)
        return ids

    def expected_logprobs(self, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> list[float]:
        """See :func:`expected_logprobs`."""
        return expected_logprobs(prompt_ids, response_ids)

    def expected_top_logprobs(
        self, prompt_ids: Sequence[int], response_ids: Sequence[int], k: int
    ) -> list[list[tuple[int, float]]]:
        """For each response token, its ``k`` top alternatives as :func:`top_logprobs` gives them."""
        key = prompt_key(prompt_ids)
        return [top_logprobs(key, i, t, k) for i, t in enumerate(response_ids)]


_ALT_IDS: Final = tuple(_encode(t)[0] for t in _ALT_TEXTS)
