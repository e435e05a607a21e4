"""Relaying an upstream's event stream to the client while the call's span is assembled."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from . import upstream_checks
from .http import Responder
from .recorder import CallRecord, StreamAssembler
from .translate import SSEDecoder
from .upstream import UpstreamError, UpstreamResponse

__all__ = ["UPSTREAM_ERROR", "error_body", "relay_stream"]

UPSTREAM_ERROR = "agentbolt_upstream_error"
"""``error.type`` of gateway answers caused by the upstream (an infrastructure failure)."""


def error_body(message: str, type_: str, code: str | None = None) -> bytes:
    """An OpenAI-style error body."""
    return orjson.dumps({"error": {"message": message, "type": type_, "code": code, "param": None}})


_DONE = b"data: [DONE]"


class _HoldDone:
    """Passes SSE bytes through but holds back everything from the ``data: [DONE]`` event on
    (and any incomplete event at the end of a chunk, which a client cannot read yet anyway)."""

    def __init__(self) -> None:
        self.pending = b""
        self.held = False

    def feed(self, chunk: bytes) -> bytes:
        """The bytes that may go to the client now."""
        data = self.pending + chunk
        if self.held:
            self.pending = data
            return b""
        cut = data.rfind(b"\n\n") + 2 if b"\n\n" in data else 0
        complete, self.pending = data[:cut], data[cut:]
        # the [DONE] event, not the same text inside an event's data (a reply quoting SSE)
        after = complete.find(b"\n\n" + _DONE)
        done = 0 if complete.startswith(_DONE) else after + 2 if after >= 0 else -1
        if done >= 0:
            self.held = True
            self.pending = complete[done:] + self.pending
            return complete[:done]
        return complete


async def relay_stream(
    answer: UpstreamResponse,
    responder: Responder,
    record: CallRecord,
    out_headers: list[tuple[str, str]],
    counters: dict[str, int],
    translator: Any = None,
    finish: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Pass the stream through (translated to the client's API when ``translator`` is set) and
    fill ``record`` from it; the caller records the span.

    ``finish`` (when given) runs once ``record`` is complete and before the stream's last event
    (``data: [DONE]``, or the translated API's closing events) is sent: the gateway makes the call
    durable there, so a client that received the whole answer has it in the store.

    A stream that breaks, or ends without ``data: [DONE]`` or without any completion chunk, ends
    with an ``agentbolt_upstream_error`` event (counted in ``counters["upstream_errors"]``).
    """
    counters["streams"] += 1
    responder.start_stream(200, out_headers)
    assembler = StreamAssembler(record.operation)
    decoder = SSEDecoder() if translator is not None else None
    holder = _HoldDone() if translator is None and finish is not None else None
    try:
        async for chunk in answer.iter_chunks():
            if responder.disconnected:
                answer.close()
                record.error_type = "client_disconnected"
                record.error_message = "the client closed the connection mid-stream"
                break
            if decoder is None:
                responder.write(chunk if holder is None else holder.feed(chunk))
            else:
                responder.write(b"".join(translator.feed(c) for c in decoder.feed(chunk)))
            assembler.feed(chunk)
            await responder.drain()
    except UpstreamError as exc:
        counters["upstream_errors"] += 1
        record.error_type = UPSTREAM_ERROR
        record.error_message = f"the upstream stream broke: {exc}"
        if holder is not None:  # what was held is not an answer's end: send it before the error
            responder.write(holder.pending)
            holder.pending = b""
        if translator is not None:
            responder.write(translator.close(record.error_message))
        else:
            responder.write(
                b"data: " + error_body(record.error_message, UPSTREAM_ERROR, "upstream_stream_broken") + b"\n\n"
            )
    if holder is not None and not holder.held and holder.pending:  # a tail without [DONE]: not held back
        responder.write(holder.pending)
        holder.pending = b""
    if record.error_type is None and assembler.error is None:
        problem = upstream_checks.stream_problem(assembler.done, len(assembler.choices))
        if problem is not None:
            counters["upstream_errors"] += 1
            record.error_type = UPSTREAM_ERROR
            record.error_message = problem
            if translator is not None:
                responder.write(translator.close(problem))
            else:
                responder.write(b"data: " + error_body(problem, UPSTREAM_ERROR, "upstream_invalid_stream") + b"\n\n")
    record.end_ns = time.time_ns()
    record.status = 200
    if assembler.error is not None and record.error_type is None:
        record.error_type = str(assembler.error.get("type") or "stream_error")
        record.error_message = str(assembler.error.get("message") or assembler.error)
    record.response = assembler.response()
    if finish is not None:
        await finish()
    if holder is not None and holder.pending and not responder.disconnected:
        responder.write(holder.pending)
    if translator is not None and not responder.disconnected:
        responder.write(translator.close(record.error_message if assembler.error is not None else None))
    if not responder.disconnected:
        responder.end_stream()
