"""Which live calls were in flight when the serve process died (``{state_dir}/inflight.log``).

An answered call is durable before its last byte leaves (the gateway's ``durable_calls`` and
call log), so after a crash and restart the store has every call a client received in full. What it cannot say is which
sessions had a call *cut* by the crash: such a call never reached the store. This journal does:
one line when a call starts (``+{n}\\t{rollout_id}``) and one when it ends (``-{n}``), each a
single unbuffered ``write`` (the kernel has it once the call returns, so a ``kill -9`` of the
process loses nothing; a power cut may lose the tail, which then looks like calls that ended).
On start, :meth:`InflightJournal.cut` reads the calls that started and never ended, and the
journal begins afresh. Past ``compact_bytes`` it is rewritten with only the calls in flight (a
new file renamed over it), so it stays small under traffic that never pauses.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

__all__ = ["InflightJournal"]

log = logging.getLogger(__name__)


class InflightJournal:
    """Start and end lines of live calls; see the module docstring.

    Args:
        directory: where ``inflight.log`` is kept (the serve process's ``state_dir``).
        compact_bytes: the size past which the journal is rewritten with only the calls in flight.
    """

    def __init__(self, directory: str | Path, *, compact_bytes: int = 4 << 20) -> None:
        self.path = Path(directory) / "inflight.log"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.compact_bytes = compact_bytes
        self._fd: int | None = None
        self._next = 0
        self._open: dict[int, str] = {}
        self._size = 0

    def cut(self) -> set[str]:
        """Rollout ids of calls a previous process started and never ended (call before :meth:`open`)."""
        if not self.path.exists():
            return set()
        started: dict[str, str] = {}
        for line in self.path.read_bytes().decode("utf-8", "replace").splitlines():
            if line.startswith("+") and "\t" in line:
                number, rollout_id = line[1:].split("\t", 1)
                started[number] = rollout_id
            elif line.startswith("-"):
                started.pop(line[1:], None)
        return set(started.values())

    def open(self) -> None:
        """Start a fresh journal (what :meth:`cut` read is gone)."""
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        self._size = 0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def started(self, rollout_id: str) -> int:
        """Record that a call of ``rollout_id`` started; returns its number for :meth:`ended`."""
        self._next += 1
        number = self._next
        self._open[number] = rollout_id
        self._write(f"+{number}\t{rollout_id}\n".encode())
        return number

    def ended(self, number: int) -> None:
        """Record that call ``number`` ended (answered, failed or cut by its client)."""
        self._open.pop(number, None)
        self._write(f"-{number}\n".encode())
        if self._size > self.compact_bytes and self._fd is not None:
            self._compact()

    def _compact(self) -> None:
        """Replace the journal by one holding only the start lines of the calls in flight: written
        to a new file, then renamed over the old one, so a kill at any moment leaves one of the two,
        both naming every call in flight."""
        assert self._fd is not None
        data = "".join(f"+{n}\t{rollout_id}\n" for n, rollout_id in self._open.items()).encode()
        fresh = self.path.with_name(self.path.name + ".new")
        fd = -1
        try:
            fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
            os.write(fd, data)
            os.replace(fresh, self.path)
        except OSError as exc:  # keep appending to the old journal
            if fd >= 0:
                os.close(fd)
            log.warning("cannot compact %s (%s); it keeps growing", self.path, exc)
            return
        os.close(self._fd)
        self._fd = fd
        self._size = len(data)

    def _write(self, data: bytes) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, data)
            self._size += len(data)
        except OSError as exc:  # a full disk must not fail live calls
            log.warning("cannot write %s (%s): a crash now may leave cut sessions open", self.path, exc)
