"""The serve process's durable record of what it decided (``{state_dir}/ledger.jsonl``).

The store holds the sessions, their calls and their rewards; the ledger holds what only the
serve process knows: its run id, which sessions each update consumed, every gate decision and
which version is live with its checkpoint. One JSON object per line, appended and fsynced
before the decision takes effect, so a restart replays it and resumes exactly (a torn last line
from a crash is ignored).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from ..errors import UserError

__all__ = ["Ledger"]

log = logging.getLogger(__name__)


class Ledger:
    """Append-only JSONL events; :meth:`replay` reads them back."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / "ledger.jsonl"

    def replay(self) -> Iterator[dict[str, Any]]:
        """Every event recorded so far, oldest first."""
        if not self.path.exists():
            return
        with self.path.open("rb") as f:
            lines = f.read().split(b"\n")
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                if number == len(lines) or (number == len(lines) - 1 and not lines[-1]):
                    log.warning("ignoring a torn last line of %s (a crash while writing it)", self.path)
                    continue
                raise UserError(f"{self.path} line {number} is not JSON; the serve state is damaged") from None
            if isinstance(event, dict):
                yield event

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        """Record one event durably (written and fsynced before returning)."""
        record = {"event": event, "time": time.time(), **fields}
        with self.path.open("ab") as f:
            f.write(orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
            f.flush()
            os.fsync(f.fileno())
        return record
