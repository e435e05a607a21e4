"""The in-flight journal (``{state_dir}/inflight.log``) under any sequence of call starts and
ends: what a new process reads after a kill at any moment names exactly the calls in flight, and
the file stays small under traffic that never pauses (some call always in flight)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from agentbolt.online.inflight import InflightJournal

COMPACT_BYTES = 256


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.booleans(), st.integers(0, 7)), max_size=400))
def test_a_kill_at_any_moment_leaves_exactly_the_calls_in_flight(steps: list[tuple[bool, int]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        journal = InflightJournal(tmp, compact_bytes=COMPACT_BYTES)
        journal.open()
        open_calls: dict[int, str] = {}
        for start, k in steps:
            if start or not open_calls:
                rollout_id = f"ro-{k}"
                open_calls[journal.started(rollout_id)] = rollout_id
            else:
                number = sorted(open_calls)[k % len(open_calls)]
                journal.ended(number)
                del open_calls[number]
            # a kill -9 now: the next process reads the file as it is
            assert InflightJournal(tmp).cut() == set(open_calls.values())
        journal.close()


def test_the_journal_stays_small_while_calls_are_always_in_flight(tmp_path: Path) -> None:
    journal = InflightJournal(tmp_path, compact_bytes=COMPACT_BYTES)
    journal.open()
    long_call = journal.started("ro-long")  # in flight the whole time: the file is never empty
    previous = journal.started("ro-0")
    for i in range(1, 5000):
        current = journal.started(f"ro-{i}")
        journal.ended(previous)
        previous = current
        assert journal.path.stat().st_size <= COMPACT_BYTES + 64
    assert InflightJournal(tmp_path).cut() == {"ro-long", "ro-4999"}
    journal.ended(long_call)
    journal.ended(previous)
    journal.close()
    assert InflightJournal(tmp_path).cut() == set()
