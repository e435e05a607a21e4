"""Request fingerprints stay the same bytes whatever JSON encoder computes them: spans stored by
earlier runs (or written by another process) must still join by fingerprint."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agentbolt.request_fingerprint import fingerprints, normalized_messages


def _reference(value: Any) -> str:
    """The fingerprint's definition: SHA-256 of the compact JSON (non-ASCII kept), 16 bytes hex."""
    return hashlib.sha256(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()[:32]


_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)  # any text a JSON body can carry
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "Human"]), "content": _text}
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_message, min_size=1, max_size=6))
def test_fingerprints_match_their_definition(messages: list[dict[str, str]]) -> None:
    normalized = normalized_messages(messages)
    assert normalized is not None
    assert fingerprints(messages) == [
        _reference(normalized),
        _reference([len(normalized), normalized[-1]]),
    ]


def test_a_known_fingerprint_does_not_change() -> None:
    """Computed before the gateway switched encoders (``json.dumps``)."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Wie spät ist es? \n"}]
    assert fingerprints(messages) == ["4b25597dcdf18719310d02809b038ed5", "fcbf2216e06fd802d32b5ffd355c6e67"]
