"""A daemon thread that applies due deadlines and expired leases at a fixed interval."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Sweeper:
    """Calls ``sweep()`` every ``interval_s`` seconds until :meth:`stop`.

    The thread starts lazily on the first :meth:`start` (backends call it when work exists),
    so short-lived stores in tests cost no thread. ``interval_s <= 0`` disables it.
    """

    def __init__(self, sweep: Callable[[], int], interval_s: float, *, name: str) -> None:
        self._sweep = sweep
        self._interval = interval_s
        self._name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        if interval_s > 0:
            self.start()

    def start(self) -> None:
        with self._lock:
            if self._thread is not None or self._stop.is_set() or self._interval <= 0:
                return
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(self._interval):
            try:
                ended = self._sweep()
            except Exception as exc:  # keep sweeping; the next store call surfaces real problems
                if not failing:  # one traceback per outage, not one per interval
                    log.warning("%s failed; retrying every %.1f s: %s", self._name, self._interval, exc, exc_info=True)
                failing = True
                continue
            if failing:
                log.info("%s recovered", self._name)
                failing = False
            if ended:
                log.debug("%s ended %d attempts", self._name, ended)

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)
