"""Progress written to a log (not a terminal): whole lines, each phase under its own label."""

from __future__ import annotations

import io
import re

import e2e_agents
from rich.console import Console

from agentbolt.options import RunnerOptions
from agentbolt.progress_lines import LineProgress
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer
from agentbolt.trainer import Trainer

LINE = re.compile(r"^\[\d\d:\d\d:\d\d\] (?P<text>.*)$")


def log_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, width=80), out


def test_each_phase_and_step_is_one_whole_line_under_its_own_label() -> None:
    console, out = log_console()
    progress = LineProgress(console)
    held_out = progress.phase("held-out (96 tasks)", 96)
    held_out.advance(96)
    held_out.done()
    progress.metrics(0, {"val/accuracy": 0.3021, "val/reward": 0.3646})
    step = progress.phase("step 1 rollouts", 32)
    step.advance(31)
    step.done()
    step.done()  # a second done() writes nothing more
    progress.metrics(1, {f"lightningrl/advantage/metric_{i}": i / 7 for i in range(12)})  # far over 80 columns
    lines = out.getvalue().splitlines()
    texts = [LINE.match(line).group("text") for line in lines]  # type: ignore[union-attr]
    assert len(texts) == 4
    assert re.fullmatch(r"held-out \(96 tasks\): 96/96 in \d+\.\d s", texts[0])
    assert texts[1] == "step 0: val/accuracy=0.3021, val/reward=0.3646"
    assert re.fullmatch(r"step 1 rollouts: 31/32 in \d+\.\d s", texts[2])
    assert texts[3].startswith("step 1: lightningrl/advantage/metric_0=0,") and texts[3].endswith("metric_11=1.571")
    assert "…" not in out.getvalue()


def test_a_trainer_writing_to_a_log_uses_lines_not_bars() -> None:
    console, out = log_console()
    with FakeLLMServer(FakeLLM()) as server:
        trainer = Trainer(e2e_agents.plain_agent, store="memory://", runners=RunnerOptions(n=0), progress=True)
        trainer.console = console
        result = trainer.dev([{"i": 1}, {"i": 2}], llm=server.base_url)
    assert result.succeeded == 2
    phases = [m for m in (LINE.match(line) for line in out.getvalue().splitlines()) if m]
    assert phases, out.getvalue()
    assert re.fullmatch(r"evaluate: 2/2 in \d+\.\d s", phases[0].group("text")), out.getvalue()
    assert "━" not in out.getvalue() and "…" not in out.getvalue()  # no bar drawn, nothing cut short
