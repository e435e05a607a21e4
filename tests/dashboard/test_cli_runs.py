"""``agentbolt runs|rollouts|export|dashboard`` against the store of real tiny-model runs."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from dashboard_helpers import sql
from typer.testing import CliRunner

from agentbolt.cli import app
from agentbolt.errors import UserError
from agentbolt.store import open_store
from agentbolt.types import Transition

runner = CliRunner()


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "250"})
    return result.exit_code, result.stdout, result.stderr


def test_runs_list_and_show(tiny_store: str, store_db: Path) -> None:
    code, out, _ = invoke("runs", "list", "--store", tiny_store, "--json")
    assert code == 0
    listed = [json.loads(line) for line in out.splitlines()]
    assert {r["run_id"] for r in listed} >= {r for (r,) in sql(store_db, "SELECT run_id FROM runs")}
    trained = [r for r in listed if r["name"] and r["name"].startswith("tiny-")]
    assert len(trained) == 2 and all(r["status"] == "succeeded" and r["steps"] == 2 for r in trained)
    code, out, _ = invoke("runs", "list", "--store", tiny_store)
    assert code == 0 and trained[0]["run_id"] in out
    code, out, _ = invoke("runs", "show", trained[0]["run_id"], "--store", tiny_store)
    assert code == 0
    assert "torch-grpo" in out and "held-out accuracy" in out and "main metrics per step" in out
    assert '"group_size"' not in out  # the settings and every metric only with --all
    code, out, _ = invoke("runs", "show", trained[0]["run_id"], "--store", tiny_store, "--all")
    assert code == 0 and '"group_size": 4' in out and "update/loss=" in out


def test_rollouts_list_and_show(tiny_store: str, store_db: Path) -> None:
    run_id = sql(store_db, "SELECT run_id FROM runs ORDER BY id LIMIT 1")[0][0]
    code, out, _ = invoke("rollouts", "list", "--store", tiny_store, "--run", run_id, "--status", "succeeded")
    (n,) = sql(store_db, "SELECT COUNT(*) FROM rollouts WHERE run_id = ? AND status = 'succeeded'", run_id)[0]
    assert code == 0 and (f"{n} rollouts of {run_id}" in out or f"50 of {n} rollouts" in out)
    code, out, _ = invoke("rollouts", "list", "--store", tiny_store, "--run", run_id, "--status", "failed")
    assert code == 0 and f"0 rollouts of {run_id}" in out
    rollout_id, span_id = sql(
        store_db,
        "SELECT rollout_id, body FROM rollouts JOIN spans ON spans.rkey = rollouts.id "
        "WHERE run_id = ? AND mode = 'train' AND body LIKE '%response_token_ids%' LIMIT 1",
        run_id,
    )[0]
    span_id = json.loads(span_id)["span_id"]
    code, out, _ = invoke("rollouts", "show", rollout_id, "--store", tiny_store, "--wide")
    assert code == 0
    assert "spans (latest attempt)" in out and "agentbolt.llm" in out and "reward" in out
    assert "transitions (LightningRL final credit, grpo advantage, group of 4)" in " ".join(out.split())
    assert span_id in out and "yes" in out and "exact" in out


def _exact_calls(store_db: Path, run_id: str, mode: str) -> int:
    return sql(
        store_db,
        "SELECT COUNT(*) FROM spans JOIN rollouts ON rollouts.id = spans.rkey WHERE run_id = ? AND mode = ? "
        'AND body LIKE \'%"agentbolt.llm.token_source":"exact"%\'',
        run_id,
        mode,
    )[0][0]


def test_export_takes_training_rollouts_unless_asked(tiny_store: str, store_db: Path, tmp_path: Path) -> None:
    """The held-out rollouts never leak into exported training data; --mode val|all takes them on request, and
    the command says how many of each it wrote."""
    run_id = sql(store_db, "SELECT run_id FROM runs ORDER BY id LIMIT 1")[0][0]
    rollouts = dict(sql(store_db, "SELECT mode, COUNT(*) FROM rollouts WHERE run_id = ? GROUP BY mode", run_id))
    train_calls, val_calls = _exact_calls(store_db, run_id, "train"), _exact_calls(store_db, run_id, "val")
    assert rollouts["val"] > 0 and val_calls > 0 and train_calls > 0
    out_file = tmp_path / "t.jsonl"
    code, _, err = invoke("export", "--run", run_id, "--format", "jsonl", "--store", tiny_store, "-o", str(out_file))
    assert code == 0
    transitions = [Transition.model_validate_json(line) for line in out_file.read_text().splitlines()]
    assert len(transitions) == train_calls
    assert (
        f"exported {train_calls} transitions of {run_id} to {out_file}: {train_calls} from {rollouts['train']} " in err
    )
    assert f"({rollouts['val']} held-out (val) rollouts left out; --mode all includes them)" in err
    val_ids = {r for (r,) in sql(store_db, "SELECT rollout_id FROM rollouts WHERE run_id = ? AND mode = 'val'", run_id)}
    assert not {x.rollout_id for x in transitions} & val_ids
    assert all(x.prompt_ids and x.response_ids and x.response_logprobs and x.advantage is not None for x in transitions)
    assert {x.rollout_id.split(":")[0] for x in transitions} == {run_id}
    for mode, expected in (("val", val_calls), ("all", train_calls + val_calls)):
        code, out, err = invoke(
            "export", "--run", run_id, "--format", "sft-jsonl", "--mode", mode, "--store", tiny_store
        )
        records = [json.loads(line) for line in out.splitlines()]
        assert code == 0 and len(records) == expected and f"exported {expected} transitions" in err
        assert ({r["rollout_id"] for r in records} <= val_ids) == (mode == "val")
    code, _, err = invoke("export", "--run", run_id, "--format", "sft-jsonl", "--mode", "all", "--store", tiny_store)
    assert (
        f"{train_calls} from {rollouts['train']} training rollouts; {val_calls} from {rollouts['val']} held-out" in err
    )
    code, _, err = invoke("export", "--run", run_id, "--mode", "held-out", "--store", tiny_store)
    assert code == 2 and "'train', 'val', 'all'" in err

    code, out, err = invoke("export", "--run", run_id, "--format", "otlp", "--store", tiny_store, "--mode", "all")
    assert code == 0
    requests = [json.loads(line) for line in out.splitlines()]
    spans = [s for req in requests for rs in req["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    (n,) = sql(
        store_db, "SELECT COUNT(*) FROM spans JOIN rollouts ON rollouts.id = spans.rkey WHERE run_id = ?", run_id
    )[0]
    assert len(spans) == n and all(len(s["spanId"]) == 16 for s in spans)


def test_doctor_counts_training_groups_only_and_reports_training_health(tiny_store: str, store_db: Path) -> None:
    """The held-out rollouts (groups of one) are never trained: no singleton-group finding for them."""
    run_id = sql(store_db, "SELECT run_id FROM runs ORDER BY id LIMIT 1")[0][0]
    (val_groups,) = sql(store_db, "SELECT COUNT(DISTINCT group_id) FROM rollouts WHERE mode = 'val'")[0]
    assert val_groups > 0
    _, out, _ = invoke("doctor", "--store", tiny_store, "--json")
    report = json.loads(out)
    assert "singleton_groups" not in {f["code"] for f in report["findings"]}
    assert report["counts"]["singleton_groups"] == 0 and report["counts"]["groups_trained"]
    health = {r["run_id"]: r for r in report["runs"]}
    assert health[run_id]["first"]["rollouts"] == health[run_id]["last"]["rollouts"] == 8  # 2 tasks x 4 samples
    assert health[run_id]["held_out"]["tasks"] == 2 and health[run_id]["held_out"]["paired"]
    _, out, _ = invoke("doctor", "--store", tiny_store, "--run", run_id)
    assert f"training health of {run_id}: steps 1 -> 2 (8 and 8 training rollouts)" in out
    assert "held-out reward" in out and "tokens with p >= 0.99" in out


def test_a_held_out_rollout_is_never_shown_as_trained(tiny_store: str, store_db: Path) -> None:
    rollout_id = sql(store_db, "SELECT rollout_id FROM rollouts WHERE mode = 'val' AND status = 'succeeded' LIMIT 1")
    code, out, _ = invoke("rollouts", "show", rollout_id[0][0], "--store", tiny_store)
    assert code == 0 and "held-out: never trained" in out and " yes " not in out


def test_bad_input_is_a_clear_error(tiny_store: str, tmp_path: Path) -> None:
    code, _, err = invoke("runs", "list", "--store", f"sqlite:///{tmp_path}/missing.db")
    assert code == 2 and "does not exist" in err
    assert not (tmp_path / "missing.db").exists()  # never created by a reader
    code, _, err = invoke("runs", "list", "--store", "http://127.0.0.1:9")
    assert code == 2 and "cannot reach the store server" in err
    code, _, err = invoke("dashboard", "--store", "http://127.0.0.1:9")
    assert code == 2 and "cannot reach the store server" in err
    code, _, err = invoke("dashboard", "--store", tiny_store, "--host", "0.0.0.0")
    assert code == 2 and "--token" in err


def test_an_older_store_is_refused_untouched(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:  # the version-1 layout: no runs, no rollouts.run_id
        conn.execute("CREATE TABLE store_meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)")
        conn.execute("INSERT INTO store_meta VALUES ('schema_version', '1')")
        conn.execute("CREATE TABLE rollouts (id INTEGER PRIMARY KEY, rollout_id VARCHAR)")
    with pytest.raises(UserError, match="table layout version 1; this agentbolt uses 2"):
        open_store(f"sqlite:///{db}")
    code, _, err = invoke("dashboard", "--store", f"sqlite:///{db}")
    assert code == 2 and "does not migrate stores" in err
    with sqlite3.connect(db) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"store_meta", "rollouts"}


def test_the_dashboard_command_serves_the_store(tiny_store: str) -> None:
    import subprocess
    import sys
    import time

    import httpx

    proc = subprocess.Popen(
        [sys.executable, "-m", "agentbolt.cli", "dashboard", "--store", tiny_store, "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stderr.readline()
        assert "agentbolt dashboard of" in line, line
        url = line.split(" at ")[1].split()[0]
        assert url.startswith("http://127.0.0.1:")
        deadline = time.monotonic() + 20
        while True:
            try:
                response = httpx.get(url + "runs")
                break
            except httpx.ConnectError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert response.status_code == 200 and "tiny-lr1e-2" in response.text
        assert '<script src="/static/vendor/uPlot.iife.min.js">' in response.text
        assert httpx.get(url + "static/vendor/uPlot.iife.min.js").status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _fits(out: str, width: int = 80) -> None:
    assert "…" not in out, out  # nothing is cut
    assert max(len(line.rstrip()) for line in out.splitlines()) <= width, out


def test_every_table_is_readable_at_80_columns(tiny_store: str, store_db: Path) -> None:
    """At 80 columns the default tables fit, cut no id and keep their key columns; --wide shows every
    column at its natural width."""

    def narrow(*args: str) -> str:
        result = runner.invoke(app, list(args), env={"COLUMNS": "80"})
        assert result.exit_code == 0, result.output
        return result.stdout

    run_ids = [r for (r,) in sql(store_db, "SELECT run_id FROM runs")]
    out = narrow("runs", "list", "--store", tiny_store)
    _fits(out)
    header = next(line for line in out.splitlines() if " run " in f" {line} ")
    assert header.split() == ["run", "status", "steps", "held-out", "reward", "s/step", "findings"]
    assert all(run_id in out for run_id in run_ids)
    wide = narrow("runs", "list", "--store", tiny_store, "--wide")
    assert {"algorithm", "model", "started", "name"} <= set(wide.split()) and "torch-grpo" in wide
    assert "tiny-lr1e-2" in wide
    assert max(len(line.rstrip()) for line in wide.splitlines()) > 80  # natural width, not folded to fit

    # a run of the fixture's (other test modules may add runs of their own to this session's store)
    run_id = next(r for r in run_ids if sql(store_db, "SELECT COUNT(*) FROM rollouts WHERE run_id = ?", r)[0][0] >= 5)
    out = narrow("rollouts", "list", "--store", tiny_store, "--run", run_id, "--limit", "5")
    _fits(out)
    shown = [line.split()[0] for line in out.splitlines() if line.strip().startswith(f"{run_id}:")]
    newest = [r for (r,) in sql(store_db, "SELECT rollout_id FROM rollouts WHERE run_id = ? ORDER BY id DESC", run_id)]
    assert len(shown) == 5 and set(shown) <= set(newest)  # whole ids, ready to paste into `rollouts show`

    (rollout_id,) = sql(
        store_db, "SELECT rollout_id FROM rollouts WHERE run_id = ? AND mode = 'train' LIMIT 1", run_id
    )[0]
    out = narrow("rollouts", "show", rollout_id, "--store", tiny_store)
    assert "…" not in out and rollout_id in out
    table_lines = out[out.index("calls: tokens in and out") :].splitlines()
    _fits("\n".join(table_lines))
    assert {"call", "prompt", "response", "advantage", "trained"} <= set(" ".join(table_lines).split())
    assert "source" in narrow("rollouts", "show", rollout_id, "--store", tiny_store, "--wide")

    _fits(narrow("runs", "show", run_id, "--store", tiny_store))
    out = narrow("plugins")
    _fits(out)
    assert "agentbolt-openai-agents" in out and "agentbolt-torch" in out
