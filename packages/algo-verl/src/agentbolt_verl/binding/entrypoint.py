"""Run training with verl: compose the config, write the task files, start verl's V1 trainer.

::

    python -m agentbolt_verl train config.yaml [-o verl.key=value ...] [--dry-run]

The store, the gateway and the agentbolt runners (which run the agent) are started separately
and share ``agentbolt.store_url``; see the package README.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentbolt.errors import UserError
from agentbolt.types import RolloutMode, Task

from ..config import TrainConfig, compose_verl_config, load_config
from .rollouts import task_row

__all__ = ["main", "prepare", "read_tasks", "train", "write_task_files"]

logger = logging.getLogger(__name__)


def read_tasks(path: str | Path) -> list[Task]:
    """Tasks from a JSON Lines file (one :class:`~agentbolt.types.Task` object per line)."""
    tasks = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                tasks.append(Task.model_validate_json(line))
            except ValueError as exc:
                raise UserError(f"{path}:{n}: not a task: {exc}") from None
    if not tasks:
        raise UserError(f"{path} holds no task")
    return tasks


def write_task_files(
    train_tasks: Iterable[Task], val_tasks: Iterable[Task] | None, workdir: str | Path
) -> tuple[Path, Path | None]:
    """Write the parquet files verl's ``RLHFDataset`` reads (see :func:`~.rollouts.task_row`)."""
    import pandas as pd

    out = Path(workdir)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path | None] = []
    for name, tasks, mode in (("train", train_tasks, RolloutMode.TRAIN), ("val", val_tasks, RolloutMode.VAL)):
        if tasks is None:
            paths.append(None)
            continue
        rows = [task_row(t, mode=mode, index=i) for i, t in enumerate(tasks)]
        if not rows:
            raise UserError(f"no {name} task")
        path = out / f"{name}.parquet"
        pd.DataFrame(rows).to_parquet(path)
        paths.append(path)
    assert paths[0] is not None
    return paths[0], paths[1]


def prepare(
    config: TrainConfig | Mapping[str, Any] | str | Path,
    *,
    train_tasks: Sequence[Task] | None = None,
    val_tasks: Sequence[Task] | None = None,
    extra: Sequence[str] = (),
) -> Any:
    """The composed verl config with ``data.train_files``/``val_files`` pointing at fresh task files.

    Tasks come from the arguments, else from ``agentbolt.data.train``/``val``. Without
    validation tasks, the training tasks are used for validation (verl needs a file).
    """
    from omegaconf import open_dict

    model = load_config(config)
    settings = model.agentbolt
    if settings.gateway.control is None or settings.gateway.url is None:
        raise UserError("agentbolt.gateway.url and agentbolt.gateway.control are required to train")
    if train_tasks is None:
        if settings.data.train is None:
            raise UserError("no training tasks: set agentbolt.data.train (a JSON Lines file of tasks)")
        train_tasks = read_tasks(settings.data.train)
    if val_tasks is None and settings.data.val is not None:
        val_tasks = read_tasks(settings.data.val)
    cfg = compose_verl_config(model, extra=extra)
    train_path, val_path = write_task_files(train_tasks, val_tasks, settings.data.workdir)
    with open_dict(cfg):
        cfg.data.train_files = str(train_path)
        cfg.data.val_files = str(val_path or train_path)
    return cfg


def train(
    config: TrainConfig | Mapping[str, Any] | str | Path,
    *,
    train_tasks: Sequence[Task] | None = None,
    val_tasks: Sequence[Task] | None = None,
    extra: Sequence[str] = (),
) -> None:
    """Train: :func:`prepare`, verl's config validation, then verl's ``run_ppo`` (Ray, GPUs)."""
    from .._verl import import_verl

    cfg = prepare(config, train_tasks=train_tasks, val_tasks=val_tasks, extra=extra)
    import_verl("verl.trainer.main_ppo")
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    from .. import registry  # noqa: F401  (the loss and the advantage sentinel resolve in the driver too)

    auto_set_device(cfg)
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    run_ppo(cfg, task_runner_class=TaskRunnerV1)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m agentbolt_verl train CONFIG [-o key=value ...] [--dry-run]``."""
    parser = argparse.ArgumentParser(prog="python -m agentbolt_verl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train with verl")
    p.add_argument("config", help="YAML/JSON file with 'agentbolt' and 'verl' sections")
    p.add_argument("-o", "--override", action="append", default=[], help="extra verl override key=value")
    p.add_argument("--dry-run", action="store_true", help="print the composed verl config and exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    try:
        if args.dry_run:
            from omegaconf import OmegaConf

            cfg = prepare(args.config, extra=args.override)
            print(OmegaConf.to_yaml(cfg))
            print(json.dumps({"train_files": cfg.data.train_files, "val_files": cfg.data.val_files}))
            return 0
        train(args.config, extra=args.override)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
