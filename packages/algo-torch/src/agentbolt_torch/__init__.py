"""agentbolt-torch."""
