"""agentbolt-verl."""
