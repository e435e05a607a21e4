"""Entry module of the ``agentbolt.plugins`` entry point: registers the algorithm by name.

Keep it cheap to import (agentbolt imports it to list plugins): the factory imports the rest.
"""

from __future__ import annotations

from typing import Any

from agentbolt import hookimpl
from agentbolt.plugins import Register


def _reinforce(**config: Any) -> Any:
    from .reinforce import Reinforce

    return Reinforce(**config)


@hookimpl
def agentbolt_register_algorithms(register: Register) -> None:
    register("reinforce", _reinforce)
