"""A scripted :class:`~agentbolt.online.policy.OnlinePolicy` for testing ``agentbolt serve``
without a model: the "weights" are named reply functions, served by two fake LLM servers.

    policy = ScriptedPolicy(
        {"base": lambda req: "I do not know.", "good": lambda req: "Paris.", "bad": lambda req: "Lyon."},
        initial="base",
        updates=["good", "bad"],           # what the 1st, 2nd, ... update produces
    )

Each ``train(rows)`` makes the training copy the next scripted weights (and records how many
rows it got); ``stage``/``promote``/``revert``/``save``/``start`` move names between the
training copy and the two slots exactly as a real backend moves weights, so the server's gate,
swap and restart logic run for real against OpenAI-compatible servers. ``latency_s`` slows every
answer (to have calls in flight during a swap).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from ..gateway import Upstream
from .fake_llm import FakeLLM, FakeLLMServer, FakeRequest

__all__ = ["ScriptedPolicy"]


class _Slot:
    def __init__(self, policy: ScriptedPolicy, latency_s: float) -> None:
        self.weights = policy.initial
        self.version = 0
        self._policy = policy
        self.server = FakeLLMServer(FakeLLM(default_reply=self.reply, latency_s=latency_s, model=policy.model))
        self.requests = 0
        self._lock = threading.Lock()

    def reply(self, request: FakeRequest) -> str:
        with self._lock:
            self.requests += 1
        return str(self._policy.weights[self.weights](request))

    def upstream(self) -> Upstream:
        return Upstream(self.server.base_url, model=self._policy.model)


class ScriptedPolicy:
    """See the module docstring.

    Args:
        weights: name -> reply function of a request (or a fixed reply string).
        initial: the weights served at first start.
        updates: the weights each successive update produces (the last repeats).
        latency_s: delay of every answer.
        model: the served model name.
    """

    trains = True

    def __init__(
        self,
        weights: Mapping[str, Callable[[FakeRequest], Any] | str],
        *,
        initial: str,
        updates: Sequence[str],
        latency_s: float = 0.0,
        model: str = "fake-model",
    ) -> None:
        self.weights = {k: (v if callable(v) else (lambda req, text=v: text)) for k, v in weights.items()}
        for name in [initial, *updates]:
            if name not in self.weights:
                raise ValueError(f"unknown weights {name!r}; known: {sorted(self.weights)}")
        self.initial = initial
        self.updates = list(updates)
        self.model = model
        self.latency_s = latency_s
        self.training = initial
        self.rows_seen: list[int] = []
        """Rows each ``train`` call got."""
        self.slots: list[_Slot] = []
        self.live = 0

    # -- OnlinePolicy -------------------------------------------------------------------------------

    def start(self, version: int, checkpoint: Path | None) -> Upstream:
        weights = self.initial
        if checkpoint is not None:
            weights = orjson.loads((checkpoint / "weights.json").read_bytes())["weights"]
            self.rows_seen = orjson.loads((checkpoint / "weights.json").read_bytes())["rows_seen"]
        self.slots = [_Slot(self, self.latency_s), _Slot(self, self.latency_s)]
        for slot in self.slots:
            slot.weights, slot.version = weights, version
            slot.server.__enter__()
        self.training = weights
        self.live = 0
        return self.slots[0].upstream()

    def train(self, rows: Sequence[Any]) -> dict[str, float]:
        self.rows_seen.append(len(rows))
        self.training = self.updates[min(len(self.rows_seen) - 1, len(self.updates) - 1)]
        return {"rows": float(len(rows))}

    def stage(self, version: int) -> Upstream:
        standby = self.slots[1 - self.live]
        standby.weights, standby.version = self.training, version
        return standby.upstream()

    def promote(self) -> Upstream:
        old = self.slots[self.live]
        self.live = 1 - self.live
        return old.upstream()

    def release(self, timeout_s: float) -> None:
        pass

    def revert(self) -> None:
        self.training = self.slots[self.live].weights

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        payload = {"weights": self.training, "rows_seen": self.rows_seen}
        (directory / "weights.json").write_bytes(orjson.dumps(payload))

    def stop(self) -> None:
        for slot in self.slots:
            slot.server.__exit__(None, None, None)
        self.slots = []

    # -- for tests ----------------------------------------------------------------------------------

    @property
    def live_weights(self) -> str:
        """The weights live clients are answered with."""
        return self.slots[self.live].weights
