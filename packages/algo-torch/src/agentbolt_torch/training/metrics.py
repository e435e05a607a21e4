"""Training metrics: a JSONL log, optional TensorBoard / W&B mirrors, progress display, curves.

- :class:`MetricsLogger` appends one JSON object per step to ``metrics.jsonl`` (flushed each
  line, so a crashed run keeps its history and ``tail -f`` works). It mirrors numeric values to
  TensorBoard when the ``tensorboard`` package is importable (``tensorboard=None``, the
  default, means "if installed") and to Weights & Biases only when asked (``wandb=True``) or
  when the program already started a W&B run; neither is a dependency.
- :class:`TrainingProgress` shows a rich progress bar with the latest metrics.
- :func:`plot_curves` draws reward per step (raw and moving average) and held-out accuracy to a
  PNG with matplotlib's Agg canvas (no display, no global pyplot state).

Conventional keys (what :func:`plot_curves` looks for by default): ``train/reward`` (mean
reward of the step's rollouts) and ``val/accuracy`` (held-out accuracy, logged every few steps).
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard

import orjson

__all__ = [
    "ACCURACY_KEY",
    "REWARD_KEY",
    "MetricsLogger",
    "TrainingProgress",
    "curve_figure",
    "format_metrics",
    "per_rollout",
    "plot_curves",
    "plot_reward",
    "read_metrics",
    "step_means",
]

logger = logging.getLogger(__name__)

REWARD_KEY = "train/reward"
"""Default key of the per-step mean reward."""
ACCURACY_KEY = "val/accuracy"
"""Default key of the held-out accuracy."""


def _flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{name}/"))
        elif hasattr(value, "as_dict"):
            out.update(_flatten(value.as_dict(), f"{name}/"))
        elif hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
            out[name] = value.item()
        else:
            out[name] = value
    return out


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


class MetricsLogger:
    """Append per-step metrics to a JSONL file (and TensorBoard / W&B when available).

    Args:
        path: a ``.jsonl`` file, or a directory (the file is ``metrics.jsonl`` inside it).
        tensorboard: ``None`` mirrors to TensorBoard (event files next to the JSONL) if the
            ``tensorboard`` package is installed; ``True`` requires it; ``False`` disables.
        wandb: ``None`` mirrors to an already active W&B run, if any; ``True`` also starts one
            (``wandb.init(**wandb_init)``); ``False`` disables.
        wandb_init: keyword arguments of ``wandb.init``.
        append: add to an existing file (resuming a run). ``False`` starts a fresh file and
            keeps an existing one as ``metrics.<its mtime>.jsonl`` next to it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        tensorboard: bool | None = None,
        wandb: bool | None = None,
        wandb_init: Mapping[str, Any] | None = None,
        append: bool = True,
    ) -> None:
        path = Path(path)
        if path.suffix != ".jsonl":
            path = path / "metrics.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        if not append and path.exists() and path.stat().st_size:
            stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(path.stat().st_mtime))
            kept = path.with_name(f"{path.stem}.{stamp}.jsonl")
            n = 1
            while kept.exists():  # never overwrite an earlier run's file
                kept, n = path.with_name(f"{path.stem}.{stamp}-{n}.jsonl"), n + 1
            path.rename(kept)
            logger.info("a new run: the previous %s is kept as %s", path.name, kept.name)
        self.path = path
        self._file = path.open("ab")
        self._tb: Any = None
        self._wandb: Any = None
        self._t0 = time.time()
        if tensorboard or (tensorboard is None and importlib.util.find_spec("tensorboard") is not None):
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(path.parent / "tensorboard"))
            except Exception as exc:
                if tensorboard:
                    from agentbolt.errors import MissingDependencyError

                    raise MissingDependencyError("tensorboard", "tensorboard", "TensorBoard logging") from exc
                logger.debug("TensorBoard not available: %s", exc)
        if wandb:
            try:
                import wandb as wandb_module
            except ImportError as exc:
                from agentbolt.errors import MissingDependencyError

                raise MissingDependencyError("wandb", "wandb", "Weights & Biases logging") from exc
            if wandb_module.run is None:
                wandb_module.init(**dict(wandb_init or {}))
            self._wandb = wandb_module
        elif wandb is None:  # mirror only into a run the user already started (never import wandb here)
            module = sys.modules.get("wandb")
            if module is not None and getattr(module, "run", None) is not None:
                self._wandb = module

    @property
    def tensorboard_enabled(self) -> bool:
        """True when values are mirrored to TensorBoard."""
        return self._tb is not None

    def log(self, metrics: Mapping[str, Any], step: int | None = None, *, prefix: str = "") -> dict[str, Any]:
        """Append one record: ``{"step", "time", "elapsed_s", **metrics}`` (nested dicts and
        objects with ``as_dict()`` are flattened with ``/``). Returns the record."""
        record: dict[str, Any] = {"step": step, "time": time.time(), "elapsed_s": time.time() - self._t0}
        record.update(_flatten(metrics, prefix))
        self._file.write(orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY, default=str) + b"\n")
        self._file.flush()
        numeric = {k: v for k, v in record.items() if _is_number(v) and k not in ("step", "time")}
        if self._tb is not None:
            for key, value in numeric.items():
                if math.isfinite(value):
                    self._tb.add_scalar(key, value, global_step=step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)
        return record

    def close(self) -> None:
        """Close the file and the mirrors."""
        self._file.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Records of a metrics JSONL file (a directory means its ``metrics.jsonl``); bad lines are skipped."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    records = []
    with path.open("rb") as f:
        for line in f:
            if line.strip():
                try:
                    records.append(orjson.loads(line))
                except orjson.JSONDecodeError:
                    logger.warning("skipping a malformed line in %s", path)
    return records


STEP_KEYS = (
    "time/step_s",
    "time/rollouts_s",
    "time/update_s",
    "engine/prompt_tokens",
    "engine/cached_prompt_tokens",
    "engine/busy_s",
    "update/prompt_len_mean",
    "update/response_len_mean",
    "update/n_transitions",
    "update/zero_advantage_skipped",
    "time/trainer_wait_share",
    "time/rollouts_wait_share",
    "lightningrl/staleness_mean",
)
"""What :func:`step_means` averages by default: where a training step's time goes."""


def per_rollout(records: Iterable[Mapping[str, Any]]) -> dict[str, float | None]:
    """LLM calls and transitions per training rollout, summed over the steps' ``lightningrl/*``
    metrics (``calls_per_rollout``, ``transitions_per_rollout``; ``None`` without a trained step)."""
    steps = [r for r in records if _is_number(r.get("lightningrl/rollouts"))]
    rollouts = sum(float(r["lightningrl/rollouts"]) for r in steps)
    if not rollouts:
        return {"calls_per_rollout": None, "transitions_per_rollout": None}
    return {
        "calls_per_rollout": sum(float(r.get("lightningrl/calls", 0.0)) for r in steps) / rollouts,
        "transitions_per_rollout": sum(float(r.get("lightningrl/transitions", 0.0)) for r in steps) / rollouts,
    }


def step_means(records: Iterable[Mapping[str, Any]], keys: Sequence[str] = STEP_KEYS) -> dict[str, float]:
    """Means of ``keys`` over the training steps (records with ``time/step_s``) of a run.

    ``records`` are :func:`read_metrics` records or a result's ``history``; a key no step
    recorded is left out.
    """
    steps = [r for r in records if _is_number(r.get("time/step_s"))]
    means = {}
    for key in keys:
        values = [float(r[key]) for r in steps if _is_number(r.get(key))]
        if values:
            means[key] = sum(values) / len(values)
    return means


_DEFAULT_KEYS = ("train/reward", "loss", "kl", "entropy", "clip_frac", "seconds")


def format_metrics(metrics: Mapping[str, Any], keys: Sequence[str] | None = None) -> str:
    """A compact one-line summary, e.g. ``reward 0.512 | loss 0.0131 | kl 0.0004``.

    Keys are matched exactly or by their last ``/`` component; missing keys are left out.
    """
    flat = _flatten(metrics)
    parts = []
    for key in keys or _DEFAULT_KEYS:
        value = flat.get(key)
        if value is None:
            matches = [v for k, v in flat.items() if k.rsplit("/", 1)[-1] == key]
            value = matches[0] if matches else None
        if value is None:
            continue
        label = key.rsplit("/", 1)[-1]
        parts.append(f"{label} {value:.4g}" if _is_number(value) else f"{label} {value}")
    return " | ".join(parts)


class TrainingProgress:
    """A rich progress bar over training steps with the latest metrics next to it.

    Example::

        with TrainingProgress(total_steps=30) as progress:
            for step in range(30):
                ...
                progress.advance(metrics)
    """

    def __init__(
        self,
        total_steps: int,
        *,
        description: str = "training",
        keys: Sequence[str] | None = None,
        console: Any = None,
    ) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.keys = keys
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[summary]}"),
            console=console,
        )
        self._task = self._progress.add_task(description, total=total_steps, summary="")

    def advance(self, metrics: Mapping[str, Any] | None = None, steps: int = 1) -> None:
        """Count ``steps`` done and show ``metrics``."""
        summary = format_metrics(metrics, self.keys) if metrics else ""
        self._progress.update(self._task, advance=steps, summary=summary)

    def log(self, message: str) -> None:
        """Print a line above the bar (e.g. an evaluation result)."""
        self._progress.console.log(message)

    def __enter__(self) -> TrainingProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()


def _series(records: Iterable[Mapping[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for i, record in enumerate(records):
        value = record.get(key)
        if _is_number(value) and math.isfinite(value):
            step = record.get("step")
            xs.append(float(step if _is_number(step) else i))
            ys.append(float(value))
    return xs, ys


def _moving_average(values: Sequence[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_curves(
    source: str | os.PathLike[str] | Sequence[Mapping[str, Any]],
    out_png: str | os.PathLike[str],
    *,
    reward_key: str = REWARD_KEY,
    accuracy_key: str = ACCURACY_KEY,
    window: int = 5,
    title: str | None = None,
) -> Path:
    """Plot reward per step (and its moving average) and held-out accuracy to ``out_png``
    (:func:`curve_figure`).

    ``source`` is a metrics JSONL path (or its directory) or a list of records. Panels without
    data are left out; with no data at all the figure says so. Returns the PNG path.
    """
    records = read_metrics(source) if isinstance(source, str | os.PathLike) else list(source)
    fig = curve_figure(records, reward_key=reward_key, accuracy_key=accuracy_key, window=window, title=title)
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    return out


def plot_reward(
    ax: Any, records: Sequence[Mapping[str, Any]], *, reward_key: str = REWARD_KEY, window: int = 5
) -> None:
    """Draw the training reward per step and its moving average on the matplotlib axes ``ax``,
    the legend below the axes (it hides no point). :func:`curve_figure` and the published
    examples' curves (``benchmarks/examples.py``) draw their reward panel with it."""
    xs, ys = _series(records, reward_key)
    if not xs:
        return
    ax.plot(xs, ys, color="tab:blue", alpha=0.35, marker=".", linewidth=1, label="per step")
    if len(ys) > 1:
        ax.plot(xs, _moving_average(ys, window), color="tab:blue", linewidth=2, label=f"moving avg ({window})")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)  # below: hides no point


def curve_figure(
    records: Sequence[Mapping[str, Any]],
    *,
    reward_key: str = REWARD_KEY,
    accuracy_key: str = ACCURACY_KEY,
    window: int = 5,
    title: str | None = None,
) -> Any:
    """The matplotlib ``Figure`` of :func:`plot_curves`: whole-step ticks, the reward legend below
    the axes (it hides no point), the held-out accuracy with ± 1 se bars and each evaluation's n."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    reward = _series(records, reward_key)
    accuracy = _series(records, accuracy_key)
    panels = [(reward_key, reward), (accuracy_key, accuracy)]
    panels = [p for p in panels if p[1][0]] or [(reward_key, reward)]
    fig = Figure(figsize=(6 * len(panels), 4), dpi=100)
    FigureCanvasAgg(fig)
    from matplotlib.ticker import MaxNLocator

    counts = dict(zip(*_series(records, "val/n"), strict=True))
    for i, (key, (xs, ys)) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        if not xs:
            ax.text(0.5, 0.5, f"no '{key}' values logged", ha="center", va="center", transform=ax.transAxes)
        elif key == reward_key:
            plot_reward(ax, records, reward_key=reward_key, window=window)
        else:
            ns = [counts.get(x) for x in xs]
            # a share of n held-out questions: its standard error is sqrt(p (1 - p) / n)
            errors = [math.sqrt(max(y * (1 - y), 0.0) / n) if n else 0.0 for y, n in zip(ys, ns, strict=True)]
            ax.errorbar(
                xs, ys, yerr=errors if any(errors) else None, color="tab:green", marker="o", linewidth=2, capsize=4
            )
            for x, y, n in zip(xs, ys, ns, strict=True):
                label = f"{y:.2f}" + (f"\nn={n:.0f}" if n else "")
                ax.annotate(
                    label, (x, y), textcoords="offset points", xytext=(7, 0), ha="left", va="center", fontsize=8
                )
            ax.margins(x=0.12, y=0.15)  # room for the labels beside the last point and above the bars
            if any(ns):
                ax.text(0.01, 0.99, "error bars: ± 1 se", transform=ax.transAxes, va="top", fontsize=8, color="0.4")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole
        ax.set_xlabel("step")
        ax.set_ylabel("mean reward of the step's rollouts" if key == reward_key else "share answered right")
        ax.set_title("training reward" if key == reward_key else "held-out accuracy")
        ax.grid(True, alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
