"""The ``openenv_server`` fixture (openenv_server.py)."""

from openenv_server import openenv_server

__all__ = ["openenv_server"]
