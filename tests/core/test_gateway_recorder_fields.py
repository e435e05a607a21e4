"""build_span keeps only finite logprobs and gives a successful call an unset status, an upstream
failure an error status (the shared status instance must not leak between spans)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.gateway.recorder import CallRecord, build_span


def _record(logprobs: list[float], **fields: Any) -> CallRecord:
    response = {
        "id": "chatcmpl-1",
        "prompt_token_ids": [1, 2],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ab"},
                "token_ids": [3, 4],
                "logprobs": {"content": [{"token": str(i), "logprob": x} for i, x in enumerate(logprobs)]},
                "finish_reason": "stop",
            }
        ],
    }
    return CallRecord(
        rollout_id="r",
        attempt_id="a",
        operation=semconv.OP_CHAT,
        request={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        upstream="http://127.0.0.1:1/v1",
        start_ns=1,
        end_ns=2,
        response=response,
        status=200,
        **fields,
    )


def test_finite_logprobs_are_kept() -> None:
    span = build_span(_record([-0.5, -1.5]))
    assert span.attributes[semconv.RESPONSE_LOGPROBS] == [-0.5, -1.5]
    assert span.status.code is t.StatusCode.UNSET


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_logprobs_are_dropped_with_a_reason(bad: float) -> None:
    span = build_span(_record([-0.5, bad]))
    assert semconv.RESPONSE_LOGPROBS not in span.attributes
    assert "non-finite" in span.attributes["agentbolt.llm.logprobs_invalid"]
    assert span.attributes[semconv.RESPONSE_TOKEN_IDS] == [3, 4]  # the ids stay


def test_a_failed_call_has_an_error_status_and_the_next_success_does_not() -> None:
    failed = build_span(_record([-0.5, -1.5], error_type="agentbolt_upstream_error", error_message="boom"))
    ok = build_span(_record([-0.5, -1.5]))
    assert failed.status.code is t.StatusCode.ERROR and failed.status.message == "boom"
    assert ok.status.code is t.StatusCode.UNSET and ok.status.message == ""
