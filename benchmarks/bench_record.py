"""The JSON record a benchmark writes with ``--record PATH``: a header saying what ran, from
which commit, when, on how many CPUs and under what load, then the benchmark's own figures.

Shared by the gateway benchmarks (``gateway.py``, ``gateway_profile.py``, ``call_log.py``)::

    load_start = load_average()
    ...  # measure
    write_record(args.record, "benchmarks/call_log.py", load_start, arms=rows)

The load average at the start and the end is the record's evidence of how quiet the machine
was: latency figures on a shared machine swing with other work, so they are read beside it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import orjson

from agentbolt.runs.evaluation import provenance

__all__ = ["load_average", "write_record"]


def load_average() -> list[float]:
    """The 1, 5 and 15-minute load averages, to 2 places."""
    return [round(x, 2) for x in os.getloadavg()]


def write_record(path: Path, benchmark: str, load_start: list[float], **figures: Any) -> None:
    """Write ``benchmark``'s record to ``path``: ``benchmark``, ``argv``, then what
    :func:`agentbolt.runs.evaluation.provenance` says of this process (``command``, ``commit`` with
    ``+dirty`` for a changed tree, ``date``, ``machine``), ``cpus``, ``load_average_start``/``_end``,
    then ``figures`` in order."""
    header = {
        "benchmark": benchmark,
        "argv": sys.argv[1:],
        **provenance(sys.argv),
        "cpus": os.cpu_count(),
        "load_average_start": load_start,
        "load_average_end": load_average(),
    }
    path.write_bytes(orjson.dumps(header | figures, option=orjson.OPT_INDENT_2) + b"\n")
    print(f"record written to {path}")
