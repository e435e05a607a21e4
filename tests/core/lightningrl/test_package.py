"""The package surface: every public name resolves, and core stays free of torch and numpy."""

from __future__ import annotations

import subprocess
import sys

import agentbolt.lightningrl as lrl


def test_every_public_name_resolves() -> None:
    for name in lrl.__all__:
        assert getattr(lrl, name) is not None, name


def test_lightningrl_imports_neither_torch_nor_numpy() -> None:
    code = (
        "import sys, agentbolt.lightningrl as l; l.LightningRL; l.LightningRLConfig; l.row_weights; l.AIRCredit; "
        "from agentbolt.plugins import Plugins; Plugins(load_entry_points=False).credit_assigners; "
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
