"""Checks on a store URL before anything is opened or created.

A store URL that does not parse, or that points somewhere the user cannot have meant (a
directory, a device, a system file, another application's SQLite database), is refused with
one :class:`~agentbolt.errors.UserError` naming the problem and what to do, and nothing is
created or changed: no database file, no lock file beside it, no journal-mode switch.

A SQLite file is taken only when it is new, empty, or carries agentbolt's schema marker (the
``store_meta`` table with a ``schema_version`` row); a database of some other application is
refused untouched (it is opened read-only, immutable, to look).
"""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path
from urllib.parse import quote, urlsplit

from ..errors import UserError

__all__ = ["check_sqlite_file", "check_store_url", "sqlite_path"]

_SQLITE_MAGIC = b"SQLite format 3\x00"
_SYSTEM_DIRS = ("/dev", "/proc", "/sys", "/etc", "/boot", "/bin", "/sbin", "/usr", "/lib", "/lib64")


def sqlite_path(url: str) -> str:
    """The file of a ``sqlite:///path.db`` URL (``sqlite:////abs.db`` for absolute paths)."""
    parts = urlsplit(url)
    if parts.netloc or not parts.path or parts.path in ("/", "/:memory:"):
        raise UserError(
            f"invalid SQLite store URL {url!r}: use sqlite:///relative/path.db or sqlite:////absolute/path.db "
            "(for a throwaway store use memory://)"
        )
    return parts.path[1:]


def check_sqlite_file(path: str) -> None:
    """Refuse a path agentbolt must not create or take over as its SQLite store."""
    if "\x00" in path:
        raise UserError(f"the SQLite store path {path!r} holds a NUL character")
    target = Path(path).expanduser()
    resolved = target.resolve(strict=False)
    for root in _SYSTEM_DIRS:
        if resolved == Path(root) or Path(root) in resolved.parents:
            raise UserError(
                f"refusing to use {resolved} as a store: it is under the system directory {root}; "
                "use a path in your project, e.g. sqlite:///runs.db"
            )
    if not target.exists():
        parent = resolved.parent
        if not parent.is_dir():
            raise UserError(
                f"the directory of the SQLite store {target} does not exist ({parent}); create it first "
                "or pick another path"
            )
        if not os.access(parent, os.W_OK):
            raise UserError(f"cannot create the SQLite store {target}: the directory {parent} is not writable")
        return
    mode = target.stat().st_mode
    if stat.S_ISDIR(mode):
        raise UserError(f"the SQLite store {target} is a directory; name a file inside it, e.g. {target}/runs.db")
    if not stat.S_ISREG(mode):
        raise UserError(f"the SQLite store {target} is not a regular file (a device, socket or pipe); refusing")
    if target.stat().st_size == 0:
        return
    with target.open("rb") as f:
        head = f.read(len(_SQLITE_MAGIC))
    if head != _SQLITE_MAGIC:
        raise UserError(
            f"{target} is not a SQLite database (it holds other data); refusing to touch it. "
            "Point the store at a new file, e.g. sqlite:///runs.db"
        )
    if not _is_agentbolt_db(resolved):
        raise UserError(
            f"{target} is another application's SQLite database (it has no agentbolt store_meta table); "
            "refusing to touch it. Point the store at a new file, e.g. sqlite:///runs.db"
        )


def _is_agentbolt_db(path: Path) -> bool:
    """True when the database has agentbolt's marker, or no tables at all (an empty database)."""
    wal = Path(f"{path}-wal")
    # Immutable: no lock, no -shm file, nothing written. A database with a live write-ahead log
    # keeps recent tables there, which an immutable read skips: read those through SQLite.
    immutable = not (wal.exists() and wal.stat().st_size > 0)
    uri = f"file:{quote(str(path))}?mode=ro" + ("&immutable=1" if immutable else "")
    try:
        conn = sqlite3.connect(uri, uri=True)
    except sqlite3.Error:
        return False
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables:
            return True
        if "store_meta" not in tables:
            return False
        row = conn.execute("SELECT value FROM store_meta WHERE key = 'schema_version'").fetchone()
        return row is not None
    except sqlite3.Error:
        return False
    finally:
        conn.close()


def check_store_url(url: object) -> None:
    """Refuse a store URL that does not parse or points somewhere unintended (see the module)."""
    if not isinstance(url, str) or "://" not in url:
        raise UserError(
            f"store URL must look like 'sqlite:///runs.db', 'memory://', 'postgresql://host/db' or "
            f"'http://host:4747', got {url!r}"
        )
    if any(ord(c) < 32 for c in url):
        raise UserError(f"store URL {url!r} holds control characters")
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a port that is not a number in range
    except ValueError as exc:
        raise UserError(f"store URL {url!r} does not parse: {exc}") from None
    scheme = parts.scheme.split("+", 1)[0].lower()
    if scheme == "sqlite":
        check_sqlite_file(sqlite_path(url))
    elif scheme in ("http", "https"):
        if not parts.hostname:
            raise UserError(f"store server URL must look like 'http://host:4747', got {url!r}")
    elif scheme in ("postgresql", "postgres") and port == 0:
        raise UserError(f"store URL {url!r}: port 0 is not a PostgreSQL port")
