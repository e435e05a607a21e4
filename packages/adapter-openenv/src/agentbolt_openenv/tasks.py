"""Tasks for an OpenEnv environment: what ``reset`` is called with.

An OpenEnv episode is chosen by its ``reset`` arguments: ``seed`` (reproducible randomness),
``episode_id``, and the environment's own options (say ``difficulty``, or the Task API's
``split`` and ``index``). An agentbolt task for an OpenEnv environment is those arguments:

- a dict: its items are the ``reset`` arguments, except ``task_id`` (agentbolt's id of the task);
  a dict with a ``"reset"`` dict uses that one instead (the rest is yours, e.g. for baselines);
- an ``int``: ``reset(seed=that)``.

:func:`seed_tasks` makes seeded tasks; :func:`server_tasks` lists a split of an environment
that serves OpenEnv's Task API (``/{env}/num_tasks``) as ``{"split", "index"}`` tasks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from agentbolt.errors import UserError

from .errors import OpenEnvServerError

__all__ = ["http_url", "reset_kwargs", "seed_tasks", "server_tasks"]


def reset_kwargs(task: Any) -> dict[str, Any]:
    """The ``reset`` arguments of ``task`` (see the module docstring)."""
    if task is None:
        return {}
    if isinstance(task, bool) or not isinstance(task, int | Mapping):
        raise UserError(
            f"an OpenEnv task is a dict of reset arguments (seed, episode_id, options) or an int seed, "
            f"got {type(task).__name__}: {task!r}"
        )
    if isinstance(task, int):
        return {"seed": task}
    if "reset" in task:
        if not isinstance(task["reset"], Mapping):
            raise UserError(f"task['reset'] must be a dict of reset arguments, got {task['reset']!r}")
        return dict(task["reset"])
    return {k: v for k, v in task.items() if k != "task_id"}


def seed_tasks(seeds: Iterable[int], *, prefix: str = "seed-", **options: Any) -> list[dict[str, Any]]:
    """One task per seed: ``{"task_id": f"{prefix}{seed}", "seed": seed, **options}``."""
    tasks = []
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise UserError(f"OpenEnv seeds are non-negative ints, got {seed!r}")
        tasks.append({"task_id": f"{prefix}{seed}", "seed": seed, **options})
    return tasks


def http_url(base_url: str) -> str:
    """``base_url`` as an ``http(s)://`` URL without a trailing slash (``ws://`` → ``http://``)."""
    url = base_url.rstrip("/")
    if url.startswith("ws://"):
        return "http://" + url.removeprefix("ws://")
    if url.startswith("wss://"):
        return "https://" + url.removeprefix("wss://")
    if not url.startswith(("http://", "https://")):
        raise UserError(f"an OpenEnv server URL starts with http://, https://, ws:// or wss://, got {base_url!r}")
    return url


def server_tasks(base_url: str, split: str, *, env_name: str | None = None, timeout_s: float = 30.0) -> list[dict]:
    """Every task of ``split`` of the environment at ``base_url``, from OpenEnv's Task API:
    ``{"task_id": f"{split}-{i}", "split": split, "index": i}`` for ``i`` below ``num_tasks``.

    The environment's ``reset`` receives ``split`` and ``index`` (OpenEnv's convention for
    choosing a task). ``env_name``: which environment of the server (needed only when it serves
    several, see ``GET /list_environments``).
    """
    import httpx

    url = http_url(base_url)
    try:
        with httpx.Client(base_url=url, timeout=timeout_s) as http:
            if env_name is None:
                names = http.get("/list_environments").raise_for_status().json()
                if len(names) != 1:
                    raise UserError(f"the server at {url} serves environments {names}: pass env_name= (one of them)")
                env_name = str(names[0])
            answer = http.post(f"/{env_name}/num_tasks", json={"split": split})
            if answer.status_code == 501:
                raise UserError(
                    f"the environment {env_name!r} at {url} does not serve OpenEnv's Task API (num_tasks): "
                    "make tasks of its reset arguments instead (seed_tasks, or dicts)"
                )
            count = int(answer.raise_for_status().json()["num_tasks"])
    except httpx.TransportError as exc:
        raise OpenEnvServerError(f"no OpenEnv server answered at {url} ({exc})", url=url) from exc
    except httpx.HTTPStatusError as exc:
        raise OpenEnvServerError(
            f"the OpenEnv server at {url} refused {exc.request.url.path}: {exc.response.status_code} "
            f"{exc.response.text[:200]}",
            url=url,
        ) from exc
    return [{"task_id": f"{split}-{i}", "split": split, "index": i} for i in range(count)]
