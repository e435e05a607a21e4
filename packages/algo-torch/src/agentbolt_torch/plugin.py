"""Plugin entry module: registers agentbolt-torch's algorithm (cheap to import)."""
