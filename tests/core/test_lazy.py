"""Lazy package exports: a name's submodule is imported on first use, then cached."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_names_load_on_first_use_and_unknown_names_raise() -> None:
    code = (
        "import sys, agentbolt.store.server as s, agentbolt.lightningrl as at\n"
        "before = sorted(m for m in ('agentbolt.store.server.app', 'agentbolt.lightningrl.pipeline') if m in sys.modules)\n"
        "s.create_app; at.LightningRL\n"
        "after = sorted(m for m in ('agentbolt.store.server.app', 'agentbolt.lightningrl.pipeline') if m in sys.modules)\n"
        "cached = 'create_app' in vars(s) and 'LightningRL' in vars(at)\n"
        "print(before, after, cached, 'serve' in dir(s), 'grpo' in dir(at) or 'LightningRL' in dir(at))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert (
        out.stdout.split("\n")[0]
        == "[] ['agentbolt.lightningrl.pipeline', 'agentbolt.store.server.app'] True True True"
    )


def test_unknown_name() -> None:
    import agentbolt.lightningrl as lrl

    with pytest.raises(AttributeError, match=r"'agentbolt\.lightningrl' has no attribute 'nope'"):
        lrl.nope  # noqa: B018
