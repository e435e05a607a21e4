"""An arithmetic environment written with OpenEnv's own server API, and its server.

Each episode asks ``questions`` (default 2) arithmetic questions, one per step: the action is
``{"answer": <int>}``, the step's reward is ``1/questions`` for a right answer and 0 for a wrong
one, and the episode is done after the last question. ``reset(seed=..., split="train"|"test")``
picks the questions: the ``test`` split asks only held-out problems (:func:`is_heldout`), which
the ``train`` split never asks. Sessions are independent (``SUPPORTS_CONCURRENT_SESSIONS``).

Run the server (OpenEnv's Python server mode, no Docker)::

    uv run python examples/openenv_env/openenv_arith.py --port 8011
    # or: cd examples/openenv_env && uv run uvicorn openenv_arith:app --host 127.0.0.1 --port 8011
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import signal
import zlib
from typing import Any
from uuid import uuid4

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

QUESTIONS = 2
"""Questions per episode (``reset(questions=...)`` changes it)."""

PROBLEMS = [(a, op, b) for a in range(2, 31) for b in range(1, 21) for op in "+-"]
"""Every problem: ``a + b`` or ``a - b`` with 2 <= a <= 30 and 1 <= b <= 20 (1,160 of them)."""


def is_heldout(problem: tuple[int, str, int]) -> bool:
    """About one problem in eight is held out (a fixed hash of the problem): the ``test`` split
    asks only these, the ``train`` split never does."""
    a, op, b = problem
    return zlib.crc32(f"{a}{op}{b}".encode()) % 8 == 0


SPLITS = {
    "train": [p for p in PROBLEMS if not is_heldout(p)],
    "test": [p for p in PROBLEMS if is_heldout(p)],
}


def answer_of(problem: tuple[int, str, int]) -> int:
    a, op, b = problem
    return a + b if op == "+" else a - b


def question_of(problem: tuple[int, str, int]) -> str:
    a, op, b = problem
    return f"What is {a} {op} {b}?"


def episode_problems(seed: int, split: str = "train", questions: int = QUESTIONS) -> list[tuple[int, str, int]]:
    """The problems of the episode ``reset(seed=seed, split=split, questions=questions)`` asks."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    if not 1 <= questions <= 10:
        raise ValueError(f"questions must be between 1 and 10, got {questions}")
    return random.Random(f"{split}/{seed}").sample(SPLITS[split], questions)


class ArithAction(Action):
    """The agent's answer to the current question."""

    answer: int = Field(..., description="The answer, an integer")


class ArithObservation(Observation):
    """What the agent reads: feedback on its last answer and the next question."""

    text: str = Field(default="", description="Feedback on the last answer, then the next question")
    question: int = Field(default=0, description="1-based number of the current question (0 when done)")
    correct: int = Field(default=0, description="Right answers so far")


class ArithState(State):
    """The episode's state."""

    split: str = "train"
    seed: int | None = None
    questions: list[str] = Field(default_factory=list)
    answers: list[int] = Field(default_factory=list)
    correct: int = 0


class ArithEnvironment(Environment[ArithAction, ArithObservation, ArithState]):
    """Arithmetic questions, one per step; reward ``1/questions`` per right answer."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = ArithState(episode_id=str(uuid4()))
        self._problems: list[tuple[int, str, int]] = []

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        split: str = "train",
        questions: int = QUESTIONS,
        index: int | None = None,
        **kwargs: Any,
    ) -> ArithObservation:
        if index is not None:  # OpenEnv's Task API: task `index` of `split` is the episode of seed `index`
            seed = index
        if seed is None:
            seed = random.randrange(2**31)
        self._problems = episode_problems(seed, split, questions)
        self._state = ArithState(
            episode_id=episode_id or str(uuid4()),
            split=split,
            seed=seed,
            questions=[question_of(p) for p in self._problems],
        )
        return ArithObservation(text=self._ask(""), question=1, reward=None, done=False)

    def _ask(self, feedback: str) -> str:
        n = len(self._state.answers)
        head = f"{feedback} " if feedback else ""
        return f"{head}Question {n + 1} of {len(self._problems)}: {self._state.questions[n]}"

    def step(self, action: ArithAction, timeout_s: float | None = None, **kwargs: Any) -> ArithObservation:  # type: ignore[override]
        n = len(self._state.answers)
        if n >= len(self._problems):
            raise RuntimeError("the episode is over: reset first")
        gold = answer_of(self._problems[n])
        right = action.answer == gold
        self._state.answers.append(action.answer)
        self._state.step_count += 1
        self._state.correct += int(right)
        reward = (1.0 if right else 0.0) / len(self._problems)
        feedback = "Correct." if right else f"Wrong: {question_of(self._problems[n])[8:-1]} = {gold}."
        done = len(self._state.answers) == len(self._problems)
        text = f"{feedback} {self._state.correct} of {len(self._problems)} right." if done else self._ask(feedback)
        return ArithObservation(
            text=text,
            question=0 if done else n + 2,
            correct=self._state.correct,
            reward=reward,
            done=done,
            metadata={"gold": gold},
        )

    @property
    def state(self) -> ArithState:
        return self._state

    # OpenEnv's Task API (task discovery; a task is chosen by passing split and index to reset)
    def list_splits(self) -> list[str]:
        return list(SPLITS)

    def num_tasks(self, split: str) -> int:
        return {"train": 4000, "test": 200}[split]

    def get_task(self, split: str, index: int) -> dict[str, Any]:
        if not 0 <= index < self.num_tasks(split):
            raise IndexError(index)
        return {"split": split, "index": index, "questions": [question_of(p) for p in episode_problems(index, split)]}


def make_app(max_concurrent_envs: int = 64) -> Any:
    """The FastAPI app of the environment's server (OpenEnv's ``create_app``)."""
    return create_app(
        ArithEnvironment,
        ArithAction,
        ArithObservation,
        env_name="arith",
        max_concurrent_envs=max_concurrent_envs,
        state_cls=ArithState,
    )


app = make_app()


def exit_with_parent(parent_pid: int) -> None:
    """Linux: get SIGTERM when the process ``parent_pid`` (this one's parent) dies, even by SIGKILL,
    so a server started by ``train.py`` does not outlive it. Elsewhere a no-op."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: train.py's own shutdown stops the server
        return
    if os.getppid() != parent_pid:  # the parent died before the call above
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="Serve the arithmetic OpenEnv environment")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--max-concurrent-envs", type=int, default=64)
    parser.add_argument("--parent-pid", type=int, help="exit when this process, the server's parent, dies (Linux)")
    args = parser.parse_args(argv)
    if args.parent_pid is not None:
        exit_with_parent(args.parent_pid)
    uvicorn.run(make_app(args.max_concurrent_envs), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
