"""The CLI as a reader's tool, against the store of real tiny-model runs: the summary card of
``runs list`` / ``runs show`` equals the held-out record of the run, ``rollouts show`` leads with
question, reply, expected answer and a verdict that matches the reward, every reading command
takes ``-s`` and ``AGENTBOLT_STORE``, unknown ids are a clear error with exit status 1, help text
carries no markup, and the output fits 80 columns."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from dashboard_helpers import sql
from typer.testing import CliRunner

from agentbolt.cli import app
from agentbolt.runs.evaluation import read_heldout, set_score

runner = CliRunner()


def invoke(*args: str, columns: int = 80, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": str(columns), **(env or {})})
    return result.exit_code, result.stdout, result.stderr


def _fits(out: str, width: int = 80) -> None:
    assert max(len(line.rstrip()) for line in out.splitlines()) <= width, out


def first_run(store_db: Path) -> str:
    return sql(store_db, "SELECT run_id FROM runs ORDER BY id LIMIT 1")[0][0]


def test_the_card_is_the_runs_held_out_record(tiny_store: str, store_db: Path) -> None:
    """``runs list --json`` and ``runs show`` report the held-out accuracy the run record would
    publish (read_heldout + set_score: the quickstart's result.json), with its standard errors and n."""
    run_id = first_run(store_db)
    steps = [
        s for (s,) in sql(store_db, "SELECT DISTINCT step FROM rollouts WHERE run_id = ? AND mode = 'val'", run_id)
    ]
    first, last = f"val{min(steps)}", f"val{max(steps)}"
    outcomes = asyncio.run(read_heldout(tiny_store, [first, last], run_id=run_id, spans=False))
    record = set_score(
        "accuracy",
        [float(o.score() >= 1.0) for o in outcomes[first]],
        [float(o.score() >= 1.0) for o in outcomes[last]],
    )
    code, out, _ = invoke("runs", "list", "-s", tiny_store, "--json")
    assert code == 0
    card = next(json.loads(line)["summary"] for line in out.splitlines() if json.loads(line)["run_id"] == run_id)
    accuracy = card["heldout"][0]
    assert accuracy["metric"] == "accuracy" and accuracy["label"] == "held-out accuracy"
    before, after = accuracy["evaluations"][0], accuracy["evaluations"][-1]
    assert (before["mean"], before["se"], after["mean"], after["se"], after["n"]) == pytest.approx(
        (record.before, record.before_se, record.after, record.after_se, record.n)
    )
    assert card["heldout"][1]["metric"] == "reward"  # the held-out reward comes second, named as such
    rewards = [
        v
        for (v,) in sql(
            store_db,
            "SELECT json_extract(run_values, '$.\"train/reward\"') FROM run_metrics JOIN runs ON runs.id = run_key "
            "WHERE run_id = ? ORDER BY step",
            run_id,
        )
        if v is not None
    ]
    assert card["train_reward_mean_last"]["value"] == pytest.approx(sum(rewards[-5:]) / len(rewards[-5:]))

    code, out, _ = invoke("runs", "show", run_id, "-s", tiny_store)
    assert code == 0
    _fits(out)
    lines = out.splitlines()
    shown = (
        f"held-out accuracy {record.before:.3f} ± {record.before_se:.3f} -> {record.after:.3f} ± {record.after_se:.3f}"
    )
    assert shown in " ".join(out.split())
    assert next(i for i, x in enumerate(lines) if "held-out accuracy" in x) < next(
        i for i, x in enumerate(lines) if "main metrics per step" in x
    )  # the summary first
    start = next(i for i, x in enumerate(lines) if "held-out accuracy" in x)
    end = next(i for i, x in enumerate(lines) if "main metrics per step" in x)
    assert all(line.startswith("  ") for line in lines[start:end]), out  # the card, wrapped lines indented too
    assert "training reward" in lines[end + 2]  # the per-step table names the training reward as the card does
    code, out, _ = invoke("runs", "list", "-s", tiny_store)
    assert code == 0 and f"{record.before:.3f}→{record.after:.3f}" in out and "held-out: accuracy" in out
    _fits(out)


def test_rollouts_show_leads_with_the_text_and_a_verdict_that_matches_the_reward(
    tiny_store: str, store_db: Path
) -> None:
    run_id = first_run(store_db)
    rows = sql(
        store_db,
        "SELECT rollout_id, final_reward, json_extract(input, '$.question'), json_extract(input, '$.answer') "
        "FROM rollouts WHERE run_id = ? AND status = 'succeeded' ORDER BY id LIMIT 12",
        run_id,
    )
    for rollout_id, reward, question, answer in rows:
        code, out, _ = invoke("rollouts", "show", rollout_id, "-s", tiny_store)
        assert code == 0, out
        head = out[: out.index("spans (latest attempt)")]
        assert f"question  {question}" in head and f"expected  {answer}" in head and "reply " in head
        verdict = "✓ correct (accuracy)" if reward >= 1.0 else "✗ wrong (accuracy)"
        assert f"verdict {verdict}: reward {reward:g} (correct " in " ".join(head.split())
        _fits(out)
    assert rows


def test_rollouts_list_shows_questions_and_says_how_many_it_shows(tiny_store: str, store_db: Path) -> None:
    run_id = first_run(store_db)
    (total,) = sql(store_db, "SELECT COUNT(*) FROM rollouts WHERE run_id = ?", run_id)[0]
    code, out, _ = invoke("rollouts", "list", "-s", tiny_store, "--run", run_id, "--limit", "3")
    assert code == 0 and f"3 of {total} rollouts (newest; --limit N) of {run_id}" in " ".join(out.split())
    assert "What is" in out  # the question column
    _fits(out)


def test_every_reading_command_takes_the_store_from_s_or_the_environment(tiny_store: str, store_db: Path) -> None:
    run_id = first_run(store_db)
    env = {"AGENTBOLT_STORE": tiny_store}
    (rollout_id,) = sql(store_db, "SELECT rollout_id FROM rollouts WHERE run_id = ? LIMIT 1", run_id)[0]
    for args in (
        ["runs", "list"],
        ["runs", "show", run_id],
        ["rollouts", "list", "--run", run_id],
        ["rollouts", "show", rollout_id],
    ):
        code, out, err = invoke(*args, env=env)
        assert code == 0, (args, err)
        code2, out2, _ = invoke(*args, "-s", tiny_store)
        assert code2 == 0 and out2 == out
    code, out, _ = invoke("doctor", "-s", tiny_store, "--run", run_id)
    assert code in (0, 1) and f"training health of {run_id}" in out  # exit 1: a finding
    code_env, out_env, _ = invoke("doctor", "--run", run_id, env=env)
    assert (code_env, out_env) == (code, out)
    _fits(out)  # wrapped to the terminal, not 392-character lines


@pytest.mark.parametrize(
    ("args", "what"),
    [
        (["runs", "show", "run-nope"], "no run 'run-nope' in"),
        (["rollouts", "show", "ro-nope"], "no rollout 'ro-nope' in"),
        (["rollouts", "list", "--run", "run-nope"], "no run 'run-nope' in"),
        (["export", "--run", "run-nope"], "no run 'run-nope' in"),
        (["doctor", "--run", "run-nope"], "no rollouts of run 'run-nope' in"),
        (["doctor", "--rollout", "ro-nope"], "no rollout 'ro-nope' in"),
    ],
)
def test_an_unknown_id_is_a_clear_error_with_exit_1(tiny_store: str, args: list[str], what: str) -> None:
    code, out, err = invoke(*args, "-s", tiny_store)
    assert code == 1, (out, err)
    assert what in err and "lists them" in err and "[" not in err.split(" in ")[0], err
    assert "capture ok" not in out and "rollouts" not in out.split("\n")[0]  # no empty table, no report


def test_help_has_no_markup_and_fits_80_columns() -> None:
    commands = [
        [],
        ["runs", "list"],
        ["runs", "show"],
        ["rollouts", "list"],
        ["rollouts", "show"],
        ["doctor"],
        ["export"],
        ["dashboard"],
        ["runner"],
        ["plugins"],
        ["serve"],
        ["store"],
        ["store", "serve"],
        ["gateway"],
        ["gateway", "serve"],
        ["runs"],
        ["rollouts"],
    ]
    for args in commands:
        code, out, _ = invoke(*args, "--help")
        assert code == 0, args
        assert "``" not in out and ":class:" not in out and not re.search(r"\\\[", out), (args, out)
        _fits(out)
    # a choice list is never broken inside a word ("su|cceeded"): --status names each status whole
    _, out, _ = invoke("rollouts", "list", "--help")
    assert "queued, running, succeeded, failed, cancelled" in " ".join(out.replace("│", " ").split())


def test_wide_says_it_does_not_fit(tiny_store: str) -> None:
    code, out, err = invoke("runs", "list", "-s", tiny_store, "--wide")
    assert code == 0 and max(len(line) for line in out.splitlines()) > 80
    assert "--wide: this table is" in " ".join(err.split()) and "terminal 80" in " ".join(err.split())
    code, _, err = invoke("runs", "list", "-s", tiny_store)
    assert code == 0 and "--wide" not in err
