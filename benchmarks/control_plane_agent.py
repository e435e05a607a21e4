"""The synthetic agent of benchmarks/control_plane.py (a module, so runner processes import it)."""

from __future__ import annotations

import asyncio
from typing import Any

from agentbolt.capture.emit import emit_message, emit_observation, emit_reward


async def synthetic_agent(task: dict[str, Any], resources: Any) -> float:
    """3 turns; each emits 4 spans and sleeps 5 ms. The returned reward adds a 13th span."""
    for turn in range(3):
        emit_message(f"turn {turn}: thinking")
        emit_observation({"turn": turn, "rows": [1, 2, 3]})
        emit_message(f"turn {turn}: acting")
        emit_reward(0.1, attributes={"turn": turn})
        await asyncio.sleep(0.005)
    return 1.0
