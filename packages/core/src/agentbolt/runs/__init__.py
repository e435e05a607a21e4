"""Runs: what records a training or evaluation run, and what reads it back from a store.

- :mod:`~agentbolt.runs.recorder` — records a run while the trainer runs it (the records
  themselves, ``Run``, ``RunSpec``, ``RolloutSearch``…, are the store's:
  :mod:`agentbolt.store.run_records`, exported by :mod:`agentbolt.store`);
- :mod:`~agentbolt.runs.views` — read models of a run's rollouts (trajectories, transitions,
  reward statistics) for the CLI and the dashboard;
- :mod:`~agentbolt.runs.summary` — a run's summary card ("did it learn?": held-out before ->
  after with standard errors, trivial policies, training reward, s/step, findings);
- :mod:`~agentbolt.runs.answer` — a rollout's question, reply, expected answer and verdict;
- :mod:`~agentbolt.runs.checkpoint_compare` — two evaluations (checkpoints) on the same held-out
  questions: improved, regressed, both right, both wrong;
- :mod:`~agentbolt.runs.reward_view` — the reward debugger (training and held-out apart,
  discrete rewards by value, groups without reward spread);
- :mod:`~agentbolt.runs.doctor` — checks what a run captured (``agentbolt doctor``);
- :mod:`~agentbolt.runs.health` — training health of a run (reward without held-out gain,
  entropy collapse, identical samples, tool calls), for the doctor and the dashboard;
- :mod:`~agentbolt.runs.findings` — the :class:`~agentbolt.runs.findings.Finding` both report;
- :mod:`~agentbolt.runs.export` — supervised fine-tuning records from transitions;
- :mod:`~agentbolt.runs.chat_calls` — a rollout's LLM calls as chat requests and replies (gateway
  or instrumentation spans, so traced rollouts too): chat JSONL, the reward / best-k / source filters;
- :mod:`~agentbolt.runs.atif_export` — rollouts as ATIF v1.8 trajectories (the ``atif`` package's
  models), and ATIF read back as chat calls;
- :mod:`~agentbolt.runs.evaluation` — a finished run's held-out scores read back from the store
  (before/after, standard errors) and the published run record (``docs/runs/<example>/``).

Names are imported on first use, so ``import agentbolt.runs`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .doctor import DoctorReport, diagnose, doctor
    from .export import sft_records
    from .recorder import RunRecorder

__all__ = ["DoctorReport", "RunRecorder", "diagnose", "doctor", "sft_records"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "DoctorReport": "doctor",
        "diagnose": "doctor",
        "doctor": "doctor",
        "RunRecorder": "recorder",
        "sft_records": "export",
    },
)
