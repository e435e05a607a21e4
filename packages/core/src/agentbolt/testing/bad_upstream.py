"""A misbehaving OpenAI-compatible upstream (raw asyncio, so it can break HTTP on purpose).

The fake LLM (:mod:`agentbolt.testing.fake_llm`) injects well-formed failures (status codes,
timeouts, dropped connections); this one sends what a broken proxy or server sends: HTML
where JSON belongs, JSON that is not a completion, a stream cut by a TCP reset.
"""

from __future__ import annotations

import asyncio
import socket
import struct

import orjson

__all__ = ["MODES", "GarbageUpstream"]

MODES = ("not_json", "wrong_shape", "error_200", "status_500", "slow", "reset", "reset_body", "no_done")
"""Every way :class:`GarbageUpstream` can answer."""

_CHUNK = orjson.dumps(
    {
        "id": "c1",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}, "finish_reason": None}],
    }
)


class GarbageUpstream:
    """Answers every request according to ``mode``:

    ``not_json`` (200 with HTML), ``status_500`` (a 500), ``wrong_shape`` (200 with JSON that is not a completion),
    ``error_200`` (200 with an error object), ``slow`` (no answer), ``reset`` (a stream cut by a
    TCP reset mid-way), ``reset_body`` (a JSON body cut by a reset), ``no_done`` (a stream that
    ends without ``data: [DONE]``).
    """

    def __init__(self) -> None:
        self.mode = "not_json"
        self.requests = 0
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self) -> None:
        """Listen on a free loopback port."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and drop every connection."""
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                self.requests += 1
                if not await self._answer(writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter) -> bool:
        mode = self.mode
        if mode == "slow":
            await asyncio.sleep(30)
            return False
        if mode == "status_500":
            body = b'{"error": {"message": "boom", "type": "server_error"}}'
            writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
            return True
        if mode in ("not_json", "wrong_shape", "error_200"):
            body, ctype = {
                "not_json": (b"<html><body>502 Bad Gateway (nginx)</body></html>", b"text/html"),
                "wrong_shape": (b'{"object": "list", "data": []}', b"application/json"),
                "error_200": (b'{"error": {"message": "overloaded"}}', b"application/json"),
            }[mode]
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (ctype, len(body), body)
            )
            await writer.drain()
            return True
        if mode == "reset_body":
            writer.write(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{"id": "c')
            await writer.drain()
            _reset(writer)
            return False
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        event = b"data: " + _CHUNK + b"\n\n"
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
        if mode == "reset":
            await asyncio.sleep(0.05)
            _reset(writer)
            return False
        writer.write(b"0\r\n\r\n")  # no_done: a clean end, but no [DONE]
        await writer.drain()
        return True


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0), as a crashed server would."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
