"""``python -m agentbolt.cli ...``: the same as the ``agentbolt`` command."""

from .app import main

main()
