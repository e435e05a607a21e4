"""The framework compatibility matrix, one nox session per row (``./dev matrix`` runs it).

Each row of ``tests/matrix/frameworks.toml`` gets an environment of its own (frameworks pin
versions that conflict with each other and with the workspace lock): the workspace packages it
names, installed editable, plus the framework at the row's tested range. Its agent then runs
through ``Trainer.dev`` once per streaming mode (``tests/matrix/row.py``), and the session writes
``runs/matrix/ROW.json``: the install and run times, the versions installed and every
assertion's result. ``python tests/matrix/record.py`` gathers those files into the committed
record (``docs/runs/matrix.json``) and regenerates the support table in ``docs/matrix.md``.

    ./dev matrix                     # the light rows (a session each)
    ./dev matrix --heavy             # every row, the heavy ones (CrewAI, Google ADK, DSPy) included
    ./dev matrix -s "matrix(row='llamaindex')"   # one row (any nox option goes through)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nox

ROOT = Path(__file__).parent
sys.path.insert(0, str(ROOT / "tests" / "matrix"))
from row import range_requirements, rows  # noqa: E402  (the table is read in one place)

nox.options.default_venv_backend = "uv"  # a fresh environment per session: install_s is a fresh install (warm uv cache)
ROWS = rows()
HEAVY = os.environ.get("AGENTBOLT_MATRIX_HEAVY") == "1"
OUT = ROOT / "runs" / "matrix"


def _selected() -> list[str]:
    return [rid for rid, row in ROWS.items() if HEAVY or not row.get("heavy", False)]


@nox.session(python="3.11")
@nox.parametrize("row", _selected())
def matrix(session: nox.Session, row: str) -> None:
    """One row: a fresh environment, the framework at its tested range, every streaming mode."""
    spec = ROWS[row]
    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / f"{row}.json"
    packages = ["core", *spec.get("packages", [])]
    requirements = [*spec.get("requires", []), *range_requirements(spec), "packaging"]
    command = ["uv", "pip", "install", "--python", session.virtualenv.location]  # type: ignore[union-attr]
    for package in packages:
        command += ["-e", str(ROOT / "packages" / package)]
    command += requirements
    session.log(" ".join(command))
    started = time.monotonic()
    install = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    record: dict[str, object] = {
        "row": row,
        "install_s": round(time.monotonic() - started, 1),
        "requirements": requirements,
        "variants": [],
    }
    if install.returncode != 0:
        record["install_error"] = (install.stdout + install.stderr)[-3000:]
        out.write_text(json.dumps(record, indent=1) + "\n")
        session.error(f"{row}: the install failed (recorded in {out}):\n{record['install_error']}")
    variants = []
    for streaming in spec["streaming"]:
        variant_out = OUT / f"{row}-{int(streaming)}.json"
        variant_out.unlink(missing_ok=True)
        session.run(
            "python",
            str(ROOT / "tests" / "matrix" / "row.py"),
            row,
            "--streaming",
            str(int(streaming)),
            "--out",
            str(variant_out),
            success_codes=[0, 1],
            env={"AGENTOPS_LOGGING_TO_FILE": "false"},
        )
        if variant_out.exists():
            variants.append(json.loads(variant_out.read_text()))
        else:
            variants.append({"row": row, "streaming": streaming, "passed": False, "error": "no record written"})
    record["variants"] = variants
    out.write_text(json.dumps(record, indent=1) + "\n")
    failed = [v for v in variants if not v.get("passed")]
    if failed:
        session.error(f"{row}: {len(failed)} of {len(variants)} variants failed (see {out})")
