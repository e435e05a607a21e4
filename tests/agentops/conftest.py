"""AgentOps writes ``agentops.log`` into the working folder by default; its tests (and the fresh
interpreters they start, which inherit the environment) turn that off."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("agentops", reason="agentops is not installed (pip install agentbolt-agentops)")

os.environ["AGENTOPS_LOGGING_TO_FILE"] = "false"
