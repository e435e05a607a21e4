"""The run record of a calc_agent run (``docs/runs/calc_agent/``: result.json, metrics.jsonl, curve.png).

The format is the examples' shared one: per held-out tier the headline metric before (the base
model) and after (the last stage), each with its standard error, and ``stages`` -- ``base``,
``sft``, ``rl`` -- with accuracy, standard error and tool-call rate. :func:`plot` draws the curve
from metrics.jsonl: the SFT loss per step, the RL reward per step, and per tier the held-out
accuracy and tool-call rate at each stage.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

STAGES = ("base", "sft", "rl")


def machine() -> str:
    """``"2 vCPU, AVX-512, no GPU"``-style description of this machine."""
    flags = ""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        pass
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    try:
        import torch

        gpu = f"{torch.cuda.device_count()} GPU" if torch.cuda.is_available() else "no GPU"
    except ImportError:
        gpu = "no GPU"
    return f"{os.cpu_count()} vCPU, {isa}, {gpu}"


def commit(repo: Path) -> str:
    """The checkout's commit (``+dirty`` when tracked files differ from it)."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "-uno"], cwd=repo, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def heldout_entry(n: int, stages: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """One tier's record: before = the first stage measured, after = the last, and every stage."""
    order = [s for s in STAGES if s in stages]
    first, last = stages[order[0]], stages[order[-1]]
    return {
        "metric": "accuracy",
        "n": n,
        "before": first["score"],
        "before_se": first["se"],
        "after": last["score"],
        "after_se": last["se"],
        "stages": {s: dict(stages[s]) for s in order},
    }


def result(
    *,
    command: str,
    repo: Path,
    model: str,
    steps: int,
    wall_s: float,
    s_per_step: float,
    tiers: Mapping[str, Mapping[str, Mapping[str, Any]]],
    n: Mapping[str, int],
    extra: Mapping[str, Any],
    headline_tier: str = "large",
) -> dict[str, Any]:
    """The ``result.json`` of a run; ``tiers`` is ``{tier: {stage: figures}}``, ``n`` ``{tier: problems}``."""
    headline = headline_tier if headline_tier in tiers else sorted(tiers)[0]
    return {
        "example": "calc_agent",
        "command": command,
        "commit": commit(repo),
        "date": dt.date.today().isoformat(),
        "machine": machine(),
        "model": model,
        "steps": steps,
        "wall_s": round(wall_s, 1),
        "s_per_step": round(s_per_step, 2),
        "heldout": {tier: heldout_entry(n[tier], stages) for tier, stages in sorted(tiers.items())},
        "headline": f"{headline}/accuracy",
        "extra": dict(extra),
    }


_KEEP_PREFIXES = ("train/", "update/loss", "update/pg_loss", "update/entropy", "update/grad_norm", "val/", "time/")


def trim(record: Mapping[str, Any]) -> dict[str, Any]:
    """A metrics record without bulky fields (engine counters, per-call LightningRL tallies)."""
    keep = ("stage", "step", "stage_step", "tier", "kind")
    return {k: v for k, v in record.items() if k in keep or k.startswith(_KEEP_PREFIXES)}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()] if path.exists() else []


def number_steps(metrics: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The stages' metrics on one step axis: ``step`` counts trained steps over the whole run (SFT
    steps 1..S, then RL steps S+1..S+R; a held-out pass at the step after which it ran: base 0, sft
    S, rl S+R), ``stage_step`` is the step within its stage. Already numbered records pass as they are.
    """
    rows = [dict(r) for r in metrics]
    if any("stage_step" in r for r in rows):
        return rows
    last = {
        stage: max((int(r["step"]) for r in rows if r.get("stage") == stage and "step" in r), default=0)
        for stage in STAGES
    }
    offset = {"base": 0, "sft": 0, "rl": last["sft"]}
    end = {"base": 0, "sft": last["sft"], "rl": last["sft"] + last["rl"]}
    for row in rows:
        stage = row.get("stage")
        if stage not in offset:
            continue
        if row.get("kind") == "heldout":
            row["step"] = end[stage]
        elif "step" in row:
            row["stage_step"] = row["step"]
            row["step"] = offset[stage] + int(row["step"])
    return rows


def write(out: Path, result_json: Mapping[str, Any], metrics: Sequence[Mapping[str, Any]]) -> None:
    """Write result.json, metrics.jsonl (on one step axis: :func:`number_steps`) and curve.png into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result_json, indent=2) + "\n")
    (out / "metrics.jsonl").write_text("".join(json.dumps(trim(r)) + "\n" for r in number_steps(metrics)))
    plot(out / "metrics.jsonl", out / "curve.png")


def copy_record(out: Path, dest: Path) -> None:
    """Publish a run's record: copy result.json, metrics.jsonl and curve.png to ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("result.json", "metrics.jsonl", "curve.png"):
        shutil.copyfile(out / name, dest / name)


def publish(out: Path, dest: Path, *, command: str | None = None) -> None:
    """Publish the record of a run in ``out`` into ``dest`` (``docs/runs/calc_agent``), rewritten
    by this version's :func:`write` (metrics on one step axis, the curve redrawn); ``command``
    replaces the recorded command line when it was run differently (e.g. ``uv run --frozen``)."""
    result_json = json.loads((Path(out) / "result.json").read_text())
    if command is not None:
        result_json["command"] = command
    write(Path(dest), result_json, read_jsonl(Path(out) / "metrics.jsonl"))


def plot(metrics_path: Path, out_png: Path) -> Path:
    """SFT loss and RL reward per step, and held-out accuracy / tool-call rate per tier and stage."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    records = read_jsonl(metrics_path)
    fig = Figure(figsize=(15, 4), dpi=100)
    FigureCanvasAgg(fig)
    panels = [fig.add_subplot(1, 3, i + 1) for i in range(3)]
    for ax, stage, key, label in (
        (panels[0], "sft", "update/loss", "SFT: NLL of the demonstrations"),
        (panels[1], "rl", "train/reward", "RL: mean training reward"),
    ):
        points = [
            (r.get("stage_step", r["step"]), r[key])
            for r in records
            if r.get("stage") == stage and key in r and "tier" not in r and "step" in r
        ]
        if points:
            ax.plot(*zip(*points, strict=True), marker=".")
        ax.set_title(label)
        ax.set_xlabel("step")
    ax = panels[2]
    passes = [r for r in records if r.get("kind") == "heldout"]
    for tier in sorted({r["tier"] for r in passes}):
        rows = [r for r in passes if r["tier"] == tier]
        xs = [f"{r['stage']}\n{r['when']}" if "when" in r else r["stage"] for r in rows]
        ax.errorbar(
            xs,
            [r["val/accuracy"] for r in rows],
            yerr=[2 * r["val/se"] for r in rows],
            marker="o",
            capsize=3,
            label=f"{tier}: accuracy ± 2 se",
        )
        ax.plot(
            xs, [r["val/tool_call_rate"] for r in rows], linestyle="--", marker="x", label=f"{tier}: tool-call rate"
        )
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("held-out, per tier")
    if passes:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_png)
    return Path(out_png)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="publish a calc_agent run's record (e.g. into docs/runs/calc_agent)")
    parser.add_argument("out", type=Path, help="the run's --out folder (holds result.json, metrics.jsonl)")
    parser.add_argument("dest", type=Path, help="where the record goes")
    parser.add_argument("--command", help="the command line as run, when it differs from the recorded one")
    args = parser.parse_args()
    publish(args.out, args.dest, command=args.command)
    print(f"published {args.out} -> {args.dest}")
