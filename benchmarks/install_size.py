"""What ``pip install agentbolt-langchain`` (or another distribution) pulls into a fresh environment.

Run:  uv run python benchmarks/install_size.py [--rev REV ...] [--dist agentbolt-langchain]

For each git revision (``.`` is the working tree: tracked and new files): export the tree, build every workspace package into a
wheel folder (``uv build --all-packages --wheel``), create a fresh virtual environment
(``uv venv``) and install the distribution from those wheels plus the package index
(``uv pip install --find-links WHEELS DIST``). Prints the number of installed distributions, the
size of the environment's site-packages, and the distributions that differ between revisions.
Needs git, uv and the package index (every third-party dependency is downloaded or taken from
uv's cache).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def _tree_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


# Run by the fresh environment's Python: bytes installed per distribution, from its RECORD.
_SIZES = """
import importlib.metadata as m, json
sizes = {}
for d in m.distributions():
    total = 0
    for f in d.files or ():
        p = f.locate()
        if p.is_file():
            total += p.stat().st_size
    sizes[d.metadata["Name"]] = total
print(json.dumps(sizes))
"""


def measure(rev: str, dist: str, work: Path) -> tuple[dict[str, int], int]:
    """Installed ``{name: bytes}`` and site-packages bytes for ``dist`` built at ``rev``."""
    src, wheels, venv = work / "src", work / "wheels", work / "venv"
    src.mkdir()
    if rev == ".":
        listed = _run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"])
        files = [f for f in listed.split("\0") if f and (ROOT / f).is_file()]
        archive = subprocess.run(
            ["tar", "-c", "-C", str(ROOT), "--null", "-T", "-"],
            input="\0".join(files).encode(),
            check=True,
            capture_output=True,
        ).stdout
    else:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    (src / ".torch-wheels").mkdir(exist_ok=True)  # the workspace's find-links folder; no wheel is needed to build
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIRTUAL_ENV")}
    _run(["uv", "build", "--all-packages", "--wheel", "--quiet", "-o", str(wheels)], cwd=src, env=env)
    _run(["uv", "venv", "--quiet", "--python", sys.executable, str(venv)], env=env)
    python = str(venv / "bin" / "python")
    _run(["uv", "pip", "install", "--quiet", "--python", python, "--find-links", str(wheels), dist], env=env)
    installed = json.loads(_run([python, "-c", _SIZES], env=env))
    site = next((venv / "lib").glob("python*/site-packages"))
    return installed, _tree_size(site)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rev", action="append", help="git revision to measure, '.' for the working tree (repeatable; default HEAD)"
    )
    parser.add_argument("--dist", default="agentbolt-langchain", help="distribution to install")
    parser.add_argument("--top", type=int, default=12, help="list this many of the largest distributions")
    args = parser.parse_args()
    revs = args.rev or ["HEAD"]
    results: dict[str, tuple[dict[str, str], int]] = {}
    for rev in revs:
        with tempfile.TemporaryDirectory(prefix="agentbolt-install-size-") as tmp:
            results[rev] = measure(rev, args.dist, Path(tmp))
        installed, size = results[rev]
        short = "working tree" if rev == "." else _run(["git", "-C", str(ROOT), "rev-parse", "--short", rev]).strip()
        print(f"{rev} ({short}): pip install {args.dist} -> {len(installed)} packages, {size / 1e6:.1f} MB")
        largest = sorted(installed.items(), key=lambda kv: -kv[1])[: args.top]
        print("  largest: " + ", ".join(f"{name} {n / 1e6:.1f}" for name, n in largest) + " (MB)")
        ours = {name: n for name, n in installed.items() if name.startswith("agentbolt")}
        print("  agentbolt: " + ", ".join(f"{name} {n / 1e6:.2f}" for name, n in sorted(ours.items())) + " (MB)")
    if len(revs) > 1:
        first, *rest = revs
        for rev in rest:
            dropped = sorted(set(results[first][0]) - set(results[rev][0]))
            added = sorted(set(results[rev][0]) - set(results[first][0]))
            print(f"{first} -> {rev}: dropped {', '.join(dropped) or '-'}; added {', '.join(added) or '-'}")


if __name__ == "__main__":
    main()
