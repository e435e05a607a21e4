"""Plugin entry module: registers agentbolt-verl's algorithm (cheap to import)."""
