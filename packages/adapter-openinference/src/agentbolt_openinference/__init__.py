"""agentbolt-openinference: agents instrumented with OpenInference (Arize Phoenix) train under
agentbolt unchanged, and their spans give LightningRL its structure.

Runners instrument the adapter automatically when this package is installed; to do it by
hand (a notebook, a custom runner)::

    from agentbolt_openinference import OpenInferenceAdapter

    adapter = OpenInferenceAdapter()
    adapter.instrument()      # idempotent; uninstrument() undoes it

Importing this package is cheap: nothing of OpenInference is imported until the adapter is
instrumented.
"""

from __future__ import annotations

from agentbolt.plugins import distribution_version

from .adapter import OpenInferenceAdapter

__version__ = distribution_version("agentbolt-openinference")

__all__ = ["OpenInferenceAdapter", "__version__"]
