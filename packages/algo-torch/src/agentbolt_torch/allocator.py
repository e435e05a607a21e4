"""Handing the memory allocator's free pages back to the operating system between training phases.

A training process alternates phases that allocate very differently: generation (KV caches of
the running batch, the prompt cache, the weights cast for decoding) and the update (activations,
gradients, the output head's logit chunks). An allocator reuses freed memory only where the
sizes fit, so over a run the pages freed by one phase and not reusable by the next pile up:
under gperftools' tcmalloc (what ``./dev`` runs training on) the quickstart's heap grew by about
0.4 GB over 20 steps while the memory in use did not (a scratch sampler; docs/benchmarks.md,
"The default quickstart under 4 GiB").
:func:`release_free_memory` asks the allocator to return its free pages at once
(tcmalloc's ``MallocExtension::ReleaseFreeMemory``); the updater calls it before and after each
update, so each phase starts from what is in use, not from the previous phase's leftovers.

Under glibc's malloc it does nothing: ``./dev`` configures glibc never to trim, which measured
steadier step times, and an explicit trim per step was not measured.
"""

from __future__ import annotations

import ctypes
import logging
import time

__all__ = ["release_free_memory"]

logger = logging.getLogger(__name__)


def release_free_memory() -> bool:
    """Return the allocator's free pages to the operating system; ``False`` (nothing done) when
    the process does not run on an allocator that offers it (tcmalloc)."""
    try:
        release = ctypes.CDLL(None).MallocExtension_ReleaseFreeMemory
    except (AttributeError, OSError):
        return False
    started = time.perf_counter()
    release()
    logger.debug("released the allocator's free memory in %.3f s", time.perf_counter() - started)
    return True
