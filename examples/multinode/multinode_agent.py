"""The quickstart's math agent, sending the gateway's bearer token as its API key.

Runner workers on other machines reach the gateway over the network, where it requires a token
(``AGENTBOLT_GATEWAY_TOKEN``, set in the environment of each Ray worker node's ``ray start``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "quickstart"))

from agent import math_agent

from agentbolt import types as t


async def gated_math_agent(task: dict[str, Any], resources: t.Resources) -> float:
    """:func:`math_agent` with ``api_key`` = the gateway token of this node's environment."""
    assert resources.llm is not None
    token = os.environ.get("AGENTBOLT_GATEWAY_TOKEN")
    if token and not resources.llm.api_key:
        resources = resources.model_copy(update={"llm": resources.llm.model_copy(update={"api_key": token})})
    return await math_agent(task, resources)
