"""An OpenEnv environment server, started in the test session on 127.0.0.1 (the ``openenv_server`` fixture).

The environment is the worked example's (``examples/openenv_env/openenv_arith.py``: arithmetic
questions, one per step, written with OpenEnv's ``Environment``/``Action``/``Observation``),
served by OpenEnv's own ``HTTPEnvServer`` under uvicorn in a thread. Its factory records every
environment instance (one per session) and every step the server answered, so tests compare
agentbolt's rewards with what the server returned and check that each session was closed.
"""

from __future__ import annotations

import importlib.util
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load_arith_env() -> ModuleType:
    spec = importlib.util.spec_from_file_location("openenv_arith", REPO / "examples/openenv_env/openenv_arith.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


openenv_arith = sys.modules.get("openenv_arith") or _load_arith_env()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerLog:
    """What the server did: one entry per environment instance (session)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    envs: list[Any] = field(default_factory=list)
    open_now: int = 0
    open_peak: int = 0

    def steps_of(self, episode_id: str) -> list[dict[str, Any]]:
        found = [env.log for env in self.envs if env.state.episode_id == episode_id]
        assert len(found) == 1, f"episode {episode_id}: {len(found)} sessions"
        steps: list[dict[str, Any]] = found[0]
        return steps


def recording_env(log: ServerLog) -> Any:
    class RecordingArith(openenv_arith.ArithEnvironment):  # type: ignore[misc,name-defined]
        """The example's environment, recording each step it answered and its own close."""

        def __init__(self) -> None:
            super().__init__()
            self.log: list[dict[str, Any]] = []
            self.resets = 0
            self.closed = False
            with log.lock:
                log.envs.append(self)
                log.open_now += 1
                log.open_peak = max(log.open_peak, log.open_now)

        def reset(self, *args: Any, **kwargs: Any) -> Any:
            self.resets += 1
            return super().reset(*args, **kwargs)

        def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
            question = self._state.questions[len(self._state.answers)]
            obs = super().step(action, timeout_s, **kwargs)
            self.log.append({"question": question, "answer": action.answer, "reward": obs.reward, "done": obs.done})
            return obs

        def close(self) -> None:
            self.closed = True
            with log.lock:
                log.open_now -= 1

    return RecordingArith


@dataclass
class RunningServer:
    url: str
    log: ServerLog
    http_server: Any
    """OpenEnv's ``HTTPEnvServer`` (``active_sessions``)."""


@pytest.fixture
def openenv_server(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    """The arithmetic environment behind OpenEnv's ``HTTPEnvServer`` on 127.0.0.1 (uvicorn in a thread).
    ``@pytest.mark.parametrize("openenv_server", [N], indirect=True)`` sets ``max_concurrent_envs``."""
    import uvicorn
    from fastapi import FastAPI
    from openenv.core.env_server.http_server import HTTPEnvServer

    log = ServerLog()
    env_cls = recording_env(log)
    http_server = HTTPEnvServer(
        env_cls,
        openenv_arith.ArithAction,
        openenv_arith.ArithObservation,
        max_concurrent_envs=getattr(request, "param", 16),
        env_name="arith",
        state_cls=openenv_arith.ArithState,
    )
    app = FastAPI()
    http_server.register_routes(app)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="openenv-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the OpenEnv server did not start"
        time.sleep(0.05)
    try:
        yield RunningServer(f"http://127.0.0.1:{port}", log, http_server)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
