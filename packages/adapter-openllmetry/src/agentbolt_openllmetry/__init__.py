"""agentbolt-openllmetry: agents instrumented with OpenLLMetry (Traceloop) train under agentbolt
unchanged, and their spans give LightningRL its structure.

Runners instrument the adapter automatically when this package is installed; to do it by
hand (a notebook, a custom runner)::

    from agentbolt_openllmetry import OpenLLMetryAdapter

    adapter = OpenLLMetryAdapter()
    adapter.instrument()      # idempotent; uninstrument() undoes it

Importing this package is cheap: nothing of OpenLLMetry is imported until the adapter is
instrumented.
"""

from __future__ import annotations

from agentbolt.plugins import distribution_version

from .adapter import OpenLLMetryAdapter

__version__ = distribution_version("agentbolt-openllmetry")

__all__ = ["OpenLLMetryAdapter", "__version__"]
