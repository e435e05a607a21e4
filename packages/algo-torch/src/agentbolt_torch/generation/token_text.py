"""Token strings for the policy server's logprobs: each token's text and bytes (byte-level BPE
and ``<0xNN>`` byte-fallback vocabularies), cached per token id, and the logprob entries of
OpenAI's response shapes (logprobs below ``-9999`` are reported as ``-9999``: JSON has no
``-inf``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

__all__ = ["TokenText", "decode_text"]

_NEG_INF_LOGPROB = -9999.0


def _finite(x: float) -> float:
    return x if x > _NEG_INF_LOGPROB else _NEG_INF_LOGPROB


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte <-> printable-character table used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


_BYTE_DECODER = {c: b for b, c in _bytes_to_unicode().items()}
_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def decode_text(tokenizer: Any, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
    """``tokenizer.decode(ids)`` of one sequence. (transformers types the result ``str | list[str]``;
    a list comes back only for a batch of sequences, which this never passes.)"""
    text = tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
    if not isinstance(text, str):
        raise TypeError(f"{type(tokenizer).__name__}.decode returned {type(text).__name__}, not str")
    return text


class TokenText:
    """Cached per-token strings and bytes, and the logprob entries of OpenAI's responses built
    from them (chat ``logprobs.content`` entries, completions ``logprobs``)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._text: dict[int, str] = {}
        self._bytes: dict[int, list[int]] = {}

    def text(self, token_id: int) -> str:
        text = self._text.get(token_id)
        if text is None:
            text = self._text[token_id] = decode_text(self.tokenizer, [token_id])
        return text

    def bytes(self, token_id: int) -> list[int]:
        data = self._bytes.get(token_id)
        if data is None:
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            fallback = _BYTE_FALLBACK.match(piece or "")
            if fallback:
                data = [int(fallback.group(1), 16)]
            elif piece and all(c in _BYTE_DECODER for c in piece) and token_id not in self.tokenizer.all_special_ids:
                data = [_BYTE_DECODER[c] for c in piece]
            else:
                data = list(self.text(token_id).encode("utf-8"))
            self._bytes[token_id] = data
        return data

    def chat_entry(self, token_id: int, logprob: float, top: list[tuple[int, float]] | None) -> dict[str, Any]:
        return {
            "token": self.text(token_id),
            "logprob": _finite(logprob),
            "bytes": self.bytes(token_id),
            "top_logprobs": [
                {"token": self.text(t), "logprob": _finite(lp), "bytes": self.bytes(t)} for t, lp in (top or [])
            ],
        }

    def completion_logprobs(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[float],
        tops: Sequence[list[tuple[int, float]]] | None,
        offset: int,
    ) -> dict[str, Any]:
        tokens = [self.text(t) for t in token_ids]
        offsets = []
        for tok in tokens:
            offsets.append(offset)
            offset += len(tok)
        top_dicts = []
        for i, (t, lp) in enumerate(zip(token_ids, logprobs, strict=True)):
            entry = {self.text(a): _finite(b) for a, b in (tops[i] if tops is not None and i < len(tops) else [])}
            entry.setdefault(self.text(t), _finite(lp))
            top_dicts.append(entry)
        return {
            "tokens": tokens,
            "token_logprobs": [_finite(x) for x in logprobs],
            "top_logprobs": top_dicts,
            "text_offset": offsets,
        }
