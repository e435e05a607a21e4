"""agentbolt-autogen: AutoGen AgentChat runs as agentbolt spans, with no change to the agent.

Runners instrument the adapter automatically when this package is installed; to do it by
hand (a notebook, a custom runner)::

    from agentbolt_autogen import AutogenAdapter

    adapter = AutogenAdapter()
    adapter.instrument()      # idempotent; uninstrument() undoes it

Importing this package is cheap: AutoGen is imported when the adapter is instrumented.
"""

from __future__ import annotations

from agentbolt.plugins import distribution_version

from .adapter import AutogenAdapter
from .errors import AutogenCaptureWarning

__version__ = distribution_version("agentbolt-autogen")

__all__ = ["AutogenAdapter", "AutogenCaptureWarning", "__version__"]
