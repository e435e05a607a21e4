"""agentbolt-autogen: AutoGen AgentChat runs as agentbolt spans, with no change to the agent.

Runners instrument the adapter automatically when this package is installed; to do it by
hand (a notebook, a custom runner)::

    from agentbolt_autogen import AutogenAdapter

    adapter = AutogenAdapter()
    adapter.instrument()      # idempotent; uninstrument() undoes it

Importing this package is cheap: AutoGen is imported when the adapter is instrumented.
"""

from __future__ import annotations

import importlib.metadata

from .adapter import AutogenAdapter
from .errors import AutogenCaptureWarning

try:
    __version__ = importlib.metadata.version("agentbolt-autogen")
except importlib.metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+unknown"

__all__ = ["AutogenAdapter", "AutogenCaptureWarning", "__version__"]
