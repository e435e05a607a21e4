"""The gateway's local write-ahead log of answered calls (``{directory}/calls-*.log``).

With ``durable_calls`` and a call log, an answered call's span is appended here — one unbuffered
``write`` — before the answer's last byte leaves, and reaches the store in the gateway's
background batches. Once ``write`` returns the kernel has the entry, so a ``kill -9`` of the
process at any later moment loses no answered call: the next gateway (or ``agentbolt serve``)
started on the directory adds the entries to the store before it listens. Adding spans is
idempotent on (rollout id, span id), so an entry that reached the store before the crash is
skipped. A power cut may lose the entries the kernel had not written to disk yet, as it may lose
the SQLite store's last commits with ``synchronous=NORMAL`` (the default).

The log is kept in segments. Each belongs to one live gateway, which holds an exclusive
``flock`` on it until every span in it is in the store (then the segment is emptied, or
deleted once full); a segment whose lock can be taken belongs to a gateway that died, and is
what :meth:`CallLog.recover` replays. A segment holding a span the gateway dropped from its full
span buffer (the store was unreachable for long) is kept, and unlocked once the rest of its spans
are stored: the next recover adds the dropped ones. Several gateways can therefore share one directory.
Segments are created under a temporary name, locked, then renamed, so a recovering gateway never
takes a segment another has just made.

One line per span: the JSON array ``[rollout_id, attempt_id]``, a tab, and the span's body as
the store keeps it (:func:`agentbolt.spans.span_body_json`). A torn last line (the process died
inside ``write``, before the answer was sent) is skipped.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from .. import types as t
from ..errors import NotFoundError
from ..spans import span_body_json
from ..store.base import Store

__all__ = ["CallLog"]

log = logging.getLogger(__name__)

_REPLAY_BATCH = 500


@dataclass(slots=True)
class _Segment:
    path: Path
    fd: int
    size: int = 0
    first: int = 0
    """Number (the span writer's count) of the first span appended since it was last emptied."""
    last: int = 0
    """Number of the last span appended."""
    kept: bool = False
    """It holds a span the writer dropped: it stays on disk for the next :meth:`CallLog.recover`."""


class CallLog:
    """Segments of answered calls not yet known to be in the store; see the module docstring.

    Args:
        directory: where the segments live (created if missing).
        segment_bytes: a segment past this size is closed and a new one begun; the closed one
            is deleted once all its spans are in the store.
    """

    def __init__(self, directory: str | os.PathLike[str], *, segment_bytes: int = 4 << 20) -> None:
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self._current: _Segment | None = None
        self._closed: list[_Segment] = []
        self.appended = 0
        self.recovered = 0
        """Spans of dead gateways' segments that :meth:`recover` found (in the store afterwards)."""

    # -- start and stop ---------------------------------------------------------------------------

    async def recover(self, store: Store) -> int:
        """Add the spans of segments no live gateway holds to ``store``, then delete those
        segments; returns how many spans they held. Call before :meth:`open`. Spans of rollouts
        the store no longer has (purged) are dropped with a warning; any other store error
        propagates and the segment stays for the next start."""
        self.directory.mkdir(parents=True, exist_ok=True)
        found = 0
        for path in sorted(self.directory.glob("calls-*.log")):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:  # its gateway deleted it meanwhile
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a live gateway's segment
                spans = _read(path)
                for start in range(0, len(spans), _REPLAY_BATCH):
                    await _add(store, spans[start : start + _REPLAY_BATCH])
                path.unlink(missing_ok=True)
                found += len(spans)
            finally:
                os.close(fd)
        for path in self.directory.glob(".new-*"):  # a gateway died between creating and naming a segment
            with contextlib.suppress(OSError):
                fd = os.open(path, os.O_RDONLY)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    path.unlink()  # nothing is appended before the rename: it is empty
                finally:
                    os.close(fd)
        if found:
            log.info(
                "call log %s: %d answered calls of a stopped gateway checked into the store", self.directory, found
            )
        self.recovered += found
        return found

    def open(self) -> None:
        """Begin this gateway's first segment."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._current = self._new_segment()

    def close(self) -> None:
        """Stop appending; segments whose spans are all in the store are deleted, others stay
        (a later :meth:`recover` replays them)."""
        for segment in [*self._closed, *([self._current] if self._current else [])]:
            if segment.size == 0:
                segment.path.unlink(missing_ok=True)
            os.close(segment.fd)
        self._closed.clear()
        self._current = None

    # -- the hot path -----------------------------------------------------------------------------

    def append(self, span: t.Span, number: int) -> None:
        """Write one span (the span writer's ``number``-th) to the current segment: one
        unbuffered ``write``, the only cost on an answer's path."""
        segment = self._current
        if segment is None:
            raise RuntimeError("CallLog.append before open()")
        line = orjson.dumps([span.rollout_id, span.attempt_id]) + b"\t" + span_body_json(span).encode() + b"\n"
        written = os.write(segment.fd, line)
        while written < len(line):  # a regular file takes it whole unless the disk is full
            more = os.write(segment.fd, line[written:])
            if more <= 0:
                raise OSError(f"could not append to the call log {segment.path}")
            written += more
        if segment.size == 0:
            segment.first = number
        segment.size += len(line)
        segment.last = number
        self.appended += 1
        if segment.size >= self.segment_bytes:
            self._closed.append(segment)
            self._current = self._new_segment()

    def release(self, done: int) -> None:
        """The span writer's first ``done`` spans are in the store (or dropped): delete the
        closed segments they cover and empty the current one if it holds nothing newer."""
        while self._closed and self._closed[0].last <= done:
            segment = self._closed.pop(0)
            if not segment.kept:
                segment.path.unlink(missing_ok=True)
            os.close(segment.fd)  # a kept one is left unlocked: the next recover() stores its spans
        current = self._current
        if current is not None and current.size and current.last <= done:
            os.ftruncate(current.fd, 0)  # O_APPEND: the next line starts at offset 0
            current.size = 0

    def keep(self, first: int, last: int) -> None:
        """Spans ``first`` .. ``last`` will not reach the store from memory (the writer's buffer
        was full): keep the segments holding them on disk, past :meth:`release`, for the next
        :meth:`recover` on the directory to add them (the current one is closed for that)."""
        for segment in self._closed:
            if segment.size and segment.first <= last and first <= segment.last:
                segment.kept = True
        current = self._current
        if current is not None and current.size and current.first <= last and first <= current.last:
            current.kept = True
            self._closed.append(current)
            self._current = self._new_segment()
            log.error(
                "call log %s: calls dropped from the full span buffer stay in %s; the next gateway "
                "started on the directory adds them to the store",
                self.directory,
                current.path.name,
            )

    def _new_segment(self) -> _Segment:
        name = secrets.token_hex(8)
        temporary = self.directory / f".new-{name}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)  # held until the segment is released or the process dies
        path = self.directory / f"calls-{name}.log"
        os.rename(temporary, path)
        return _Segment(path, fd)


def _read(path: Path) -> list[t.Span]:
    spans: list[t.Span] = []
    data = path.read_bytes()
    lines = data.split(b"\n")
    for number, line in enumerate(lines):
        if not line:
            continue
        try:
            ids, body = line.split(b"\t", 1)
            rollout_id, attempt_id = orjson.loads(ids)
            fields: dict[str, Any] = orjson.loads(body)
            fields["rollout_id"], fields["attempt_id"] = rollout_id, attempt_id
            spans.append(t.Span.model_validate(fields))
        except (ValueError, TypeError) as exc:
            if number == len(lines) - 1:  # no newline after it: cut by the crash mid-write
                log.warning("call log %s: skipping a torn last entry (%d bytes)", path, len(line))
                continue
            raise ValueError(
                f"call log {path}, line {number + 1}: unreadable entry ({exc}); move the file out of the "
                "directory to start without it"
            ) from exc
    return spans


async def _add(store: Store, spans: Sequence[t.Span]) -> None:
    try:
        await store.add_spans(spans)
    except NotFoundError:  # some rollouts were purged: keep the others
        for span in spans:
            try:
                await store.add_spans([span])
            except NotFoundError as exc:
                log.warning("call log: dropping the span of a call in %s: %s", span.rollout_id, exc)
