"""The retrieval index of the RAG example: SQLite FTS5 with BM25 ranking (stdlib ``sqlite3``).

:func:`build_index` writes the corpus into an FTS5 table once and caches the database file;
the corpus's SHA-256 is stored beside it, and a changed corpus rebuilds the file (written to a
temporary file and renamed, so a reader never sees half an index). :class:`SearchIndex`
opens it read-only and ranks paragraphs with FTS5's ``bm25()`` (title hits weigh double).
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

_WORD = re.compile(r"\w+", re.UNICODE)
_STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "did",
        "do",
        "does",
        "for",
        "from",
        "has",
        "have",
        "in",
        "is",
        "it",
        "of",
        "on",
        "or",
        "the",
        "to",
        "was",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "whom",
        "whose",
        "why",
        "with",
    ]
)
TITLE_WEIGHT = 2.0


def corpus_hash(paragraphs: Iterable[tuple[str, str]]) -> str:
    """SHA-256 over the corpus (titles and texts, in order): the index is rebuilt when it changes."""
    h = hashlib.sha256()
    for title, text in paragraphs:
        h.update(title.encode())
        h.update(b"\x00")
        h.update(text.encode())
        h.update(b"\x01")
    return h.hexdigest()


@dataclass(frozen=True)
class Hit:
    """One retrieved paragraph."""

    title: str
    text: str
    score: float
    """FTS5 ``bm25()`` (lower is better)."""


def _indexed_hash(path: Path) -> str | None:
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'corpus_sha256'").fetchone()
    except sqlite3.Error:
        return None
    return row[0] if row else None


def build_index(paragraphs: Sequence[tuple[str, str]], path: Path) -> bool:
    """Make ``path`` an FTS5 index of ``paragraphs`` (title, text); returns whether it was (re)built.

    Nothing is done when ``path`` already indexes exactly this corpus (same SHA-256).
    """
    if not paragraphs:
        raise ValueError("the corpus is empty: no paragraph to index")
    digest = corpus_hash(paragraphs)
    if path.is_file() and _indexed_hash(path) == digest:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        with sqlite3.connect(tmp) as db:
            db.execute("CREATE VIRTUAL TABLE paragraphs USING fts5(title, text, tokenize = 'porter unicode61')")
            db.executemany("INSERT INTO paragraphs (title, text) VALUES (?, ?)", paragraphs)
            db.execute("INSERT INTO paragraphs (paragraphs) VALUES ('optimize')")
            db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
            db.executemany(
                "INSERT INTO meta VALUES (?, ?)", [("corpus_sha256", digest), ("paragraphs", str(len(paragraphs)))]
            )
        db.close()
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


def match_expression(query: str) -> str | None:
    """An FTS5 MATCH expression for free text: its words, each quoted, joined by OR (None if no word)."""
    words = [w for w in _WORD.findall(query.lower()) if w not in _STOPWORDS]
    if not words:
        words = _WORD.findall(query.lower())
    unique = list(dict.fromkeys(words))
    return " OR ".join(f'"{w}"' for w in unique) if unique else None


class SearchIndex:
    """Read-only BM25 search over an index written by :func:`build_index`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no search index at {self.path}: build it with build_index() first")

    def search(self, query: str, k: int = 3) -> list[Hit]:
        """The ``k`` best paragraphs for ``query`` by BM25 (empty when the query has no word)."""
        expression = match_expression(query)
        if expression is None:
            return []
        with sqlite3.connect(f"file:{self.path}?mode=ro", uri=True) as db:
            rows = db.execute(
                "SELECT title, text, bm25(paragraphs, ?, 1.0) AS score FROM paragraphs "
                "WHERE paragraphs MATCH ? ORDER BY score LIMIT ?",
                (TITLE_WEIGHT, expression, k),
            ).fetchall()
        db.close()
        return [Hit(title, text, score) for title, text, score in rows]


def main(argv: Sequence[str] | None = None) -> int:
    """Print how often the question itself, as the query, retrieves the paragraph holding the answer.

    ``python examples/rag_agent/retrieval.py [--data MUSIQUE_DIR]`` (default: the bundled set).
    """
    import argparse
    import os
    import sys
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from data import corpus, load_split, write_bundled

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--data", type=Path, help="a MuSiQue data folder (default: the bundled set)")
    args = p.parse_args(argv)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "agentbolt/examples/rag_agent"
    folder = args.data or write_bundled(cache / "data")
    everything = [*load_split(folder, "train"), *load_split(folder, "dev")]
    questions = [
        q
        for q in everything
        if q.question_decomposition and q.question_decomposition[-1].paragraph_support_idx is not None
    ]
    with tempfile.TemporaryDirectory() as tmp:
        build_index(corpus(everything), Path(tmp) / "index.sqlite")
        index = SearchIndex(Path(tmp) / "index.sqlite")
        for k in (1, 2, 3):
            found = 0
            for q in questions:
                support = q.question_decomposition[-1].paragraph_support_idx
                answer_paragraph = q.paragraphs[support or 0].paragraph_text
                found += answer_paragraph in [hit.text for hit in index.search(q.question, k=k)]
            print(
                f"top {k}: the answer's paragraph for {found} of {len(questions)} questions ({found / len(questions):.1%})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
