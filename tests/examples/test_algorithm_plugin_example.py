"""``examples/algorithm-plugin`` installed the way a user installs it (``uv pip install
./examples/algorithm-plugin``) into a fresh virtual environment: ``agentbolt plugins`` lists its
algorithm, and the package's own tests (agentbolt's algorithm conformance suite, REINFORCE
changing the weights) pass against the installed copy.

The fresh environment sees this environment's packages (agentbolt, agentbolt-torch, torch,
pytest) through a ``.pth`` file, so only the plugin itself is built and installed (``--no-deps``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "examples" / "algorithm-plugin"

pytestmark = pytest.mark.slow  # builds a wheel and runs the plugin's tests (minutes on 2 cores)


def _run(*cmd: str | Path, cwd: Path | None = None, timeout: float = 280) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    return subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def plugin_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of a fresh venv holding the installed plugin."""
    pytest.importorskip("agentbolt_torch")
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv not on PATH (./dev setup installs it); it installs the example like a user would")
    venv = tmp_path_factory.mktemp("plugin-env") / "venv"
    made = _run(sys.executable, "-m", "venv", "--without-pip", venv)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    purelib = _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    here = sysconfig.get_paths()["purelib"]
    # addsitedir (not a bare path) so this environment's own .pth files (editable installs) apply
    (Path(purelib) / "_agentbolt_dev_env.pth").write_text(f"import site; site.addsitedir({here!r})\n")
    installed = _run(uv, "pip", "install", "--python", python, "--no-deps", PLUGIN)
    assert installed.returncode == 0, installed.stderr
    return python


def test_agentbolt_plugins_lists_the_installed_example(plugin_python: Path) -> None:
    listed = _run(plugin_python, "-c", "from agentbolt.cli import main; main()", "plugins", "--json")
    assert listed.returncode == 0, listed.stderr
    infos = {i["name"]: i for i in json.loads(listed.stdout)}
    assert "reinforce" in infos, f"the entry point was not found; plugins: {sorted(infos)}"
    info = infos["reinforce"]
    assert info["error"] is None
    assert info["distribution"] == "agentbolt-reinforce" and info["version"] == "0.1.0"
    assert info["registered"] == {"algorithms": ["reinforce"]}

    where = _run(plugin_python, "-c", "import agentbolt_reinforce; print(agentbolt_reinforce.__file__)")
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(plugin_python.parents[1]), "not the installed copy"


@pytest.mark.timeout(900)  # eight tiny-model training runs; slow on a busy 2-core CI machine
def test_the_examples_own_tests_pass_installed(plugin_python: Path) -> None:
    result = _run(plugin_python, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider", cwd=PLUGIN, timeout=840)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "failed" not in result.stdout
