"""The peak memory of a whole run: this process and every process it started (the runner
processes, their workers), summed, in GiB.

``getrusage``'s ``ru_maxrss`` is one process's peak: the trainer's, without the runner process
that executes the agents. :class:`RunMemory` samples the resident set size (RSS, with psutil)
of this process and all its descendants every ``interval_s`` in a daemon thread and keeps the
highest sum. Pages two processes share (libraries, copy-on-write) count once per process, so
the sum is an upper bound of what the run occupies; a peak shorter than the interval can be
missed, which ``ru_maxrss`` (also reported) cannot.
"""

from __future__ import annotations

import resource
import sys
import threading
from dataclasses import dataclass
from types import TracebackType

import psutil

GIB = 2**30


@dataclass(frozen=True)
class MemoryPeak:
    """What :class:`RunMemory` measured."""

    tree_gib: float
    """Highest sum of the RSS of this process and its descendants, over the samples (GiB)."""
    processes: int
    """How many processes that highest sample summed."""
    self_maxrss_gib: float
    """This process's own peak (``getrusage`` ``ru_maxrss``), in GiB."""
    samples: int


def self_maxrss_gib() -> float:
    """This process's peak resident memory (``ru_maxrss``: KiB on Linux, bytes on macOS), in GiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak * (1 if sys.platform == "darwin" else 1024) / GIB


def tree_rss() -> tuple[int, int]:
    """(bytes, processes): the RSS of this process and its live descendants, summed."""
    root = psutil.Process()
    total, count = 0, 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
            count += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue  # ended (or not ours to read) between listing and reading
    return total, count


class RunMemory:
    """Samples :func:`tree_rss` until stopped; use as a context manager, then read :attr:`peak`."""

    def __init__(self, interval_s: float = 0.25) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="run-memory", daemon=True)
        self._best = (0, 0)
        self._samples = 0

    def _sample(self) -> None:
        total, count = tree_rss()
        self._samples += 1
        if total > self._best[0]:
            self._best = (total, count)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> RunMemory:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def peak(self) -> MemoryPeak:
        total, count = self._best
        return MemoryPeak(
            tree_gib=total / GIB, processes=count, self_maxrss_gib=self_maxrss_gib(), samples=self._samples
        )
