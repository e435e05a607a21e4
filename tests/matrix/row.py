"""Run one row of the framework matrix in this interpreter and write its result record.

    python tests/matrix/row.py ROW_ID --streaming {0,1} --out RESULT.json

The row's agent module (``tests/matrix/agents/row_ROW_ID.py``) sets up its instrumentation the way
the framework's users do (``setup()``), then its agent runs on the two tasks of
:mod:`calc` through ``Trainer.dev`` against the fake backend with exact ids. Every assertion is
computed from the store and recorded pass/fail: LightningRL calls = gateway calls = backend calls =
the hand-count, 100 % exact ids, agent and tool names, the rewards the agent computed, the same
transitions under every credit mode as a hand-count, and no connection beyond loopback from the
start of the process to its last exit handler (``OutboundGuard``, DNS lookups included): the
record is written by an exit handler registered first, so it runs after every other.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import datetime
import importlib
import importlib.metadata
import json
import math
import os
import platform
import re
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TABLE = HERE / "frameworks.toml"
CREDIT_MODES = ("final", "discounted", "intermediate", "air")
GAMMA = 0.95  # DiscountedCredit's default


def rows() -> dict[str, dict[str, Any]]:
    """The matrix's rows by id, from ``frameworks.toml``."""
    with TABLE.open("rb") as f:
        return {row["id"]: row for row in tomllib.load(f)["row"]}


def hand_credit(mode: str, reward: float, calls: int) -> list[float]:
    """Each call's credit under ``mode`` for a rollout of ``calls`` calls and final reward
    ``reward`` with no intermediate reward and no tool error, worked by hand."""
    if mode == "discounted":
        return [reward * GAMMA ** (calls - 1 - i) for i in range(calls)]
    return [reward] * calls  # final, intermediate (no step rewards), air (no signal)


def _check(ok: bool, **detail: Any) -> dict[str, Any]:
    return {"ok": bool(ok), **detail}


async def checks(store: Any, backend: Any, row: dict[str, Any], result: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    import calc

    from agentbolt import semconv
    from agentbolt.lightningrl import LightningRL
    from agentbolt.lightningrl.spans import is_tool_span

    rollouts = (await store.query_rollouts(limit=1000)).items
    spans = await store.query_spans([r.rollout_id for r in rollouts], latest_attempt_only=True)
    batches = {
        mode: LightningRL(credit=mode, advantage="grpo", allow_empty=True).process(rollouts, spans)
        for mode in CREDIT_MODES
    }
    by_rollout: dict[str, dict[str, list[Any]]] = {
        mode: {r.rollout_id: [tr for tr in batch.transitions if tr.rollout_id == r.rollout_id] for r in rollouts}
        for mode, batch in batches.items()
    }
    calls = int(row["calls"])
    gateway = {r.rollout_id: [s for s in spans[r.rollout_id] if semconv.TOKEN_SOURCE in s.attributes] for r in rollouts}
    gateway_calls = {rid: len(g) for rid, g in gateway.items()}
    lightningrl_calls = {rid: len(trs) for rid, trs in by_rollout["final"].items()}
    backend_calls = len(backend.requests)
    transitions = batches["final"].transitions

    # The tools' names from the tool spans (LightningRL's own test of a tool span), or, for a row
    # with no instrumentation (``tools_from = "gateway"``), from the tool calls the gateway recorded
    # in the model's answers. An instrumented row whose tool spans never arrive fails here: the
    # gateway's tool calls are not read in their place.
    tool_source = "gateway tool calls" if row.get("tools_from") == "gateway" else "tool spans"
    tool_names: set[str] = set()
    if tool_source == "tool spans":
        for r in rollouts:
            tool_names.update(
                str(s.attributes.get(semconv.GEN_AI_TOOL_NAME)) for s in spans[r.rollout_id] if is_tool_span(s)
            )
    else:
        for g in gateway.values():
            for s in g:
                tool_names.update(
                    re.findall(r'"name":\s*"([^"]+)"', str(s.attributes.get(semconv.GEN_AI_OUTPUT_MESSAGES, "")))
                )

    rewards = {str((r.input or {}).get("question")): r.final_reward for r in rollouts}
    credit: dict[str, Any] = {}
    for mode in CREDIT_MODES:
        got = {rid: [tr.reward for tr in sorted(trs, key=lambda tr: tr.index)] for rid, trs in by_rollout[mode].items()}
        want = {r.rollout_id: hand_credit(mode, float(r.final_reward or 0.0), calls) for r in rollouts}
        same = all(
            len(got[rid]) == len(want[rid])
            and all(
                g is not None and math.isclose(g, w, abs_tol=1e-9) for g, w in zip(got[rid], want[rid], strict=True)
            )
            for rid in want
        )
        credit[mode] = _check(same, got=list(got.values()), hand=list(want.values()))

    failed = result.failed
    # What Trainer.dev reported (agentbolt's reconciliation of framework spans with the gateway).
    reported = {
        "lightningrl_calls": getattr(result, "lightningrl_calls", None),
        "unjoined_llm_spans": getattr(result, "unjoined_llm_spans", None),
        "rollouts_unreconciled": getattr(result, "rollouts_unreconciled", None),
    }
    out = {
        "completed": _check(
            failed == 0 and len(rollouts) == len(calc.TASKS) and all(r.status.value == "succeeded" for r in rollouts),
            failed=failed,
            statuses=[r.status.value for r in rollouts],
        ),
        "calls": _check(
            all(gateway_calls[rid] == lightningrl_calls[rid] == calls for rid in gateway_calls)
            and backend_calls == sum(gateway_calls.values())
            and reported["rollouts_unreconciled"] in (0, None)
            and reported["lightningrl_calls"] in (None, sum(gateway_calls.values())),
            hand=calls,
            gateway=sorted(gateway_calls.values()),
            lightningrl=sorted(lightningrl_calls.values()),
            backend=backend_calls,
            reported=reported,
        ),
        "exact_ids": _check(
            bool(transitions)
            and all(tr.token_source.value == "exact" and tr.prompt_ids and tr.response_ids for tr in transitions),
            exact=sum(tr.token_source.value == "exact" for tr in transitions),
            of=len(transitions),
        ),
        "agent_names": _check(
            sorted({str(tr.agent_name) for tr in transitions}) == sorted(row["agents"]),
            got=sorted({str(tr.agent_name) for tr in transitions}),
        ),
        "tool_names": _check(sorted(tool_names) == sorted(row["tools"]), got=sorted(tool_names), source=tool_source),
        "rewards": _check(rewards == calc.REWARDS, got=rewards),
        "credit": _check(all(c["ok"] for c in credit.values()), modes=credit),
    }
    counts = {
        "rollouts": len(rollouts),
        "backend_calls": backend_calls,
        "streamed_calls": sum(bool(r.body.get("stream")) for r in backend.requests),  # asked with stream=true
        "gateway_calls": sum(gateway_calls.values()),
        "lightningrl_calls": sum(lightningrl_calls.values()),
        "exact": sum(tr.token_source.value == "exact" for tr in transitions),
        "dev_report": reported,
    }
    return out, counts


def versions(row: dict[str, Any]) -> dict[str, str]:
    from packaging.requirements import Requirement

    names = [Requirement(spec).name for spec in row.get("requires", [])]
    names += [Requirement(spec).name for spec in range_requirements(row)]
    out: dict[str, str] = {}
    for name in dict.fromkeys(names):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def range_requirements(row: dict[str, Any]) -> list[str]:
    """The framework requirements of the adapter package named in ``range_from`` (its
    pyproject's dependencies, the workspace package ``agentbolt`` left out)."""
    source = row.get("range_from")
    if not source:
        return []
    with (HERE.parents[1] / "packages" / source / "pyproject.toml").open("rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    return [d for d in deps if not d.startswith("agentbolt") and not d.startswith("wrapt")]


def _commit() -> str:
    """The checkout's commit, ``+dirty`` when tracked files differ from it."""
    import subprocess

    root = HERE.parents[1]
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, cwd=root)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, cwd=root
    )
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("row")
    parser.add_argument("--streaming", type=int, choices=(0, 1), required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    from agentbolt.testing.outbound import OutboundGuard

    guard = OutboundGuard().__enter__()  # on until the process ends: uploads at exit count too
    record: dict[str, Any] = {
        "row": args.row,
        "streaming": bool(args.streaming),
        "python": platform.python_version(),
        "commit": _commit(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }

    def write_record() -> None:
        checks_ = record.setdefault("checks", {})
        checks_["no_outbound"] = _check(not guard.attempts, attempts=list(guard.attempts))
        record["passed"] = "error" not in record and all(c["ok"] for c in checks_.values())
        args.out.write_text(json.dumps(record, indent=1, default=str) + "\n")

    atexit.register(write_record)  # registered first: runs after every exit handler set up later

    sys.path[:0] = [str(HERE), str(HERE / "agents")]
    row = rows()[args.row]
    record["versions"] = versions(row)
    started = time.monotonic()
    try:
        import calc

        from agentbolt.store.memory import MemoryStore
        from agentbolt.testing.fake_llm import FakeLLMServer
        from agentbolt.trainer import Trainer

        module = importlib.import_module(f"row_{args.row}")
        module.STREAMING = bool(args.streaming)
        module.setup()
        backend = module.backend() if hasattr(module, "backend") else calc.backend()
        store = MemoryStore()
        with FakeLLMServer(backend) as server:
            trainer = Trainer(
                module.agent,
                store=store,
                runners={"n": 0, "concurrency": 1},
                capture=getattr(module, "CAPTURE", {}),
                progress=False,
            )
            result = trainer.dev(list(calc.TASKS), llm=server.base_url, model="fake-model")
        if hasattr(module, "flush"):
            module.flush()
        record["checks"], record["counts"] = asyncio.run(checks(store, backend, row, result))
    except Exception as exc:  # recorded: the row fails with what went wrong
        import traceback

        record["error"] = "".join(traceback.format_exception(exc))[-4000:]
    record["run_s"] = round(time.monotonic() - started, 1)


if __name__ == "__main__":
    main()
