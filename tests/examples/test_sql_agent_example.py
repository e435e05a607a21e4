"""examples/sql_agent: the Spider loader on fixtures in Spider's format, the execution-accuracy
reward on a real SQLite database, and two training steps of the LangGraph agent end to end."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from agentbolt import semconv
from agentbolt.lightningrl import LightningRL
from agentbolt.store import open_store
from agentbolt.types import RolloutMode

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples/sql_agent"
FIXTURES = Path(__file__).resolve().parent / "fixtures/sql_agent"


def _load(name: str) -> ModuleType:
    """The example's module under a unique name (other examples also have data.py / agent.py);
    ``bundled`` (imported by data.py) has a name of its own."""
    if str(EXAMPLE) not in sys.path:
        sys.path.append(str(EXAMPLE))
    spec = importlib.util.spec_from_file_location(f"sql_agent_example_{name}", EXAMPLE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


data = _load("data")


@pytest.fixture
def spider(tmp_path: Path) -> Path:
    """A writable copy of the Spider-format fixture folder."""
    return Path(shutil.copytree(FIXTURES, tmp_path / "spider"))


# -- the loader ------------------------------------------------------------------------------------


def test_loads_spider_format_fixtures() -> None:
    train = data.load_split(FIXTURES, "train")
    dev = data.load_split(FIXTURES, "dev")
    # the worked examples are built from the schema alone, the same for every question on a database
    assert [e["query"] for e in dev[0]["examples"]] == [
        "SELECT count(*) FROM stadium WHERE Capacity >= 10",
        "SELECT Location FROM stadium WHERE Capacity <= 10",
        "SELECT Location FROM stadium ORDER BY Capacity DESC",
    ]
    assert len(train) == 4 and train[0]["examples"] == dev[0]["examples"]
    assert len(dev) == 2 and dev[1]["query"] == "SELECT Name , Capacity FROM stadium"
    task = dev[0]
    assert task["db_id"] == "concert_singer" and Path(task["db_path"]).is_file()
    assert task["schema"].splitlines() == [
        "CREATE TABLE stadium (Stadium_ID number, Location text, Name text, Capacity number, Highest number, "
        "Lowest number, Average number);",
        "CREATE TABLE singer (Singer_ID number, Name text, Country text, Song_Name text, Song_release_year text, "
        "Age number, Is_male others);",
    ]
    json.dumps(train + dev)  # task inputs travel through the store as JSON
    # the fixture's dev questions are on a database with training questions: all "seen_dbs"
    assert set(data.heldout_sets(FIXTURES)) == {"seen_dbs"}


def test_missing_database_names_the_row_and_the_file(spider: Path) -> None:
    (spider / "database/concert_singer/concert_singer.sqlite").unlink()
    with pytest.raises(
        data.SpiderDataError, match=r"dev\.json, row 0: database file .*concert_singer\.sqlite not found"
    ):
        data.load_split(spider, "dev")


def test_malformed_row_names_the_file_and_row(spider: Path) -> None:
    rows = json.loads((spider / "train_spider.json").read_text())
    del rows[1]["query"]
    (spider / "train_spider.json").write_text(json.dumps(rows))
    with pytest.raises(data.SpiderDataError, match=r"train_spider\.json, row 1: missing or empty field\(s\) 'query'"):
        data.load_split(spider, "train")


def test_unknown_db_and_bad_json_and_missing_file(spider: Path) -> None:
    rows = json.loads((spider / "dev.json").read_text())
    rows[1]["db_id"] = "nope"
    (spider / "dev.json").write_text(json.dumps(rows))
    with pytest.raises(
        data.SpiderDataError, match=r"dev\.json, row 1: db_id 'nope' is not described in .*tables\.json"
    ):
        data.load_split(spider, "dev")
    (spider / "tables.json").write_text('[{"db_id": "x",\n oops]')
    with pytest.raises(data.SpiderDataError, match=r"tables\.json: not valid JSON \(line 2"):
        data.load_split(spider, "dev")
    (spider / "tables.json").unlink()
    with pytest.raises(data.SpiderDataError, match=r"tables\.json: file not found\. Download Spider from https://"):
        data.load_split(spider, "dev")


def test_bundled_set_is_deterministic_spider_format_and_split(tmp_path: Path) -> None:
    a, b = data.ensure_bundled(tmp_path / "a"), data.ensure_bundled(tmp_path / "b")
    for name in ("train_spider.json", "dev.json", "tables.json"):
        assert (a / name).read_text() == (b / name).read_text()
    train, sets = data.load_split(a, "train"), data.heldout_sets(a)
    assert len(train) >= 300 and len(sets["seen_dbs"]) >= 100 and len(sets["unseen_dbs"]) >= 100
    row = json.loads((a / "dev.json").read_text())[0]
    assert {"db_id", "query", "query_toks", "query_toks_no_value", "question", "question_toks"} <= row.keys()
    agent = _load("agent")
    for task in train + sets["seen_dbs"] + sets["unseen_dbs"]:  # every gold query runs and is its own perfect answer
        assert agent.execution_accuracy(task["db_path"], task["query"], task["query"]) == 1.0


def test_bundled_heldout_shares_nothing_with_training(tmp_path: Path) -> None:
    """The claims of the README, checked on the data: held-out databases absent from training,
    no held-out gold query equal to a training one once literals are masked, no held-out
    question asked in training, no gold query of the shape of a prompt example."""
    folder = data.ensure_bundled(tmp_path / "spider")
    bundled = sys.modules["bundled"]
    train, sets = data.load_split(folder, "train"), data.heldout_sets(folder)
    tables = {t["db_id"]: t for t in json.loads((folder / "tables.json").read_text())}
    train_dbs = {t["db_id"] for t in train}
    unseen_dbs = {t["db_id"] for t in sets["unseen_dbs"]}
    assert unseen_dbs == set(bundled.HELDOUT_DBS) and len(unseen_dbs) >= 2 and not unseen_dbs & train_dbs
    train_tables = {n.lower() for db in train_dbs for n in tables[db]["table_names_original"]}
    assert not {n.lower() for db in unseen_dbs for n in tables[db]["table_names_original"]} & train_tables
    assert {t["db_id"] for t in sets["seen_dbs"]} == train_dbs  # new questions on every training database

    train_masked = {bundled.masked(t["query"]) for t in train}
    train_questions = {t["question"] for t in train}
    raw = {(r["question"], r["query"]): r for r in json.loads((folder / "dev.json").read_text())}
    for name, tasks in sets.items():
        for task in tasks:
            assert bundled.masked(task["query"]) not in train_masked, (name, task["query"])
            assert task["question"] not in train_questions
            # the Spider field agrees with the masking the test relies on
            assert tuple(raw[(task["question"], task["query"])]["query_toks_no_value"]) == bundled.masked(task["query"])
    for task in train + sets["seen_dbs"] + sets["unseen_dbs"]:
        shots = {bundled.masked(e["query"]) for e in task["examples"]}
        assert len(shots) == 3 and bundled.masked(task["query"]) not in shots


def test_masking_hides_literals_only() -> None:
    bundled = sys.modules["bundled"]
    assert bundled.masked("SELECT count(*) FROM t WHERE a > 40 AND b = 'x y'") == bundled.masked(
        "select COUNT(*) from T where A > 7 and B = 'z'"
    )
    assert bundled.masked("SELECT max(a) FROM t") != bundled.masked("SELECT max(b) FROM t")
    assert bundled.masked("SELECT a FROM t WHERE b > 1.5") == ("select", "a", "from", "t", "where", "b", ">", "value")


# -- the reward ------------------------------------------------------------------------------------


def test_execution_accuracy_compares_result_multisets() -> None:
    agent = _load("agent")
    db = str(FIXTURES / "database/concert_singer/concert_singer.sqlite")
    gold = "SELECT Name FROM singer WHERE Country = 'France'"
    assert agent.execution_accuracy(db, "SELECT name FROM singer WHERE age < 45 AND country = 'France'", gold) == 1.0
    assert agent.execution_accuracy(db, "SELECT Name FROM singer WHERE Age < 40", gold) == 0.0  # one row short
    assert agent.execution_accuracy(db, "SELECT Name FROM singer", gold) == 0.0
    assert agent.execution_accuracy(db, "SELECT nme FROM singer", gold) == 0.0  # does not execute
    assert agent.execution_accuracy(db, "DELETE FROM singer", gold) == 0.0  # read-only connection
    assert agent.execution_accuracy(db, None, gold) == 0.0
    # multisets: duplicates count, order does not
    assert agent.execution_accuracy(db, "SELECT Country FROM singer ORDER BY Age", "SELECT Country FROM singer") == 1.0
    assert agent.execution_accuracy(db, "SELECT DISTINCT Country FROM singer", "SELECT Country FROM singer") == 0.0
    assert agent.execution_accuracy(db, "SELECT 2.0", "SELECT 2") == 1.0
    assert agent.extract_sql("<sql>SELECT", " count(*)\n FROM singer;") == "SELECT count(*) FROM singer"


# -- two training steps end to end ---------------------------------------------------------------


def test_two_training_steps_on_the_tiny_model(tmp_path: Path) -> None:
    """train.py in a subprocess (runner process, SQLite, gateway, adapter); then the store is checked."""
    store_url = f"sqlite:///{tmp_path}/sql.db"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE / "train.py"),
            *("--model", "tiny", "--steps", "2", "--val", "2", "--batch-size", "2", "--group-size", "2"),
            *("--no-progress", "--store", store_url, "--out", str(tmp_path / "out")),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "held-out execution accuracy" in proc.stdout and "capture:" in proc.stdout
    result = json.loads((tmp_path / "out/result.json").read_text())
    assert result["example"] == "sql_agent" and result["steps"] == 2
    assert {name: s["n"] for name, s in result["heldout"].items()} == {"seen_dbs": 2, "unseen_dbs": 2}
    assert result["headline"] == "unseen_dbs/execution_accuracy" and "train.py --model tiny" in result["command"]
    assert result["extra"]["exact_token_id_share"] == 1.0 and result["extra"]["calls_per_rollout"] >= 2
    assert (tmp_path / "out/curve.png").exists() and (tmp_path / "out/metrics.jsonl").exists()

    async def read() -> tuple[list, dict]:
        store = open_store(store_url)
        try:
            rollouts = (await store.query_rollouts(mode=RolloutMode.TRAIN, limit=1000)).items
            spans = await store.query_spans([r.rollout_id for r in rollouts], latest_attempt_only=True)
        finally:
            await store.close()
        return rollouts, spans

    rollouts, spans = asyncio.run(read())
    assert len(rollouts) == 2 * 2 * 2  # steps x tasks x samples
    batch = LightningRL(agent_match=r"^(write_query|rewrite_query)$").process(rollouts, spans)
    gateway_calls = {
        r.rollout_id: [s for s in spans[r.rollout_id] if semconv.TOKEN_SOURCE in s.attributes] for r in rollouts
    }
    by_rollout = {rr.rollout_id: rr for rr in batch.report.per_rollout}
    for r in rollouts:
        rr = by_rollout[r.rollout_id]
        # every LLM call of the rollout: a transition or an exclusion with a reason
        assert rr.calls == len(gateway_calls[r.rollout_id]) >= 2
        assert rr.trained + sum(rr.excluded.values()) == rr.calls
        assert set(rr.excluded) <= {"agent_not_selected"}
    per_agent = batch.report.per_agent
    assert set(per_agent) <= {"write_query", "check_query", "rewrite_query"}
    assert per_agent["write_query"].trained == per_agent["write_query"].calls == len(rollouts)
    assert per_agent["check_query"].calls >= len(rollouts) and per_agent["check_query"].trained == 0
    assert per_agent["check_query"].excluded == {"agent_not_selected": per_agent["check_query"].calls}
    spans_by_id = {s.span_id: s for ss in spans.values() for s in ss}
    for tr in batch.transitions:
        assert tr.agent_name in ("write_query", "rewrite_query")  # no check_query call is trained
        assert tr.token_source == "exact"
        span = spans_by_id[tr.span_id]
        if semconv.TOKEN_SOURCE in span.attributes:  # the gateway's span: the ids it recorded, unchanged
            assert list(tr.prompt_ids) == list(span.attributes[semconv.PROMPT_TOKEN_IDS])
            assert list(tr.response_ids) == list(span.attributes[semconv.RESPONSE_TOKEN_IDS])
    # the run itself trained on the same selection
    trained = [h for h in result_history(tmp_path / "out/metrics.jsonl") if "lightningrl/transitions" in h]
    assert len(trained) == 2
    assert all(h.get("lightningrl/agent/check_query/trained", 0) == 0 for h in trained)
    assert all(h["lightningrl/agent/check_query/calls"] > 0 for h in trained)


def test_per_role_policies_train_one_adapter_per_role_on_the_tiny_model(tmp_path: Path) -> None:
    """``--policies per-role``: the gateway routes each call by its role (roles.sql_role agrees with the
    LangGraph adapter's node names: no policy_mismatch), the writer's and the rewriter's calls are
    served and trained by their own adapters, the checker's by the base model and never trained."""
    store_url = f"sqlite:///{tmp_path}/sql.db"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE / "train.py"),
            *("--model", "tiny", "--steps", "1", "--val", "2", "--batch-size", "2", "--group-size", "2"),
            *("--policies", "per-role", "--lora-rank", "4"),
            *("--no-progress", "--store", store_url, "--out", str(tmp_path / "out")),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "policies: per-role (LoRA rank 4): writer, rewriter; lr 0.0001" in proc.stdout
    extra = json.loads((tmp_path / "out/result.json").read_text())["extra"]
    assert extra["policies"] == "per-role" and extra["policy_names"] == ["writer", "rewriter"]
    assert extra["lora_rank"] == 4 and extra["peak_rss_gb"] > 0 and extra["exact_token_id_share"] == 1.0
    (step,) = [h for h in result_history(tmp_path / "out/metrics.jsonl") if "lightningrl/transitions" in h]
    assert step["train/writer/n_transitions"] == step["lightningrl/agent/write_query/trained"] == 4
    assert step["lightningrl/excluded/no_policy"] == step["lightningrl/agent/check_query/calls"] > 0
    assert step.get("lightningrl/excluded/policy_mismatch", 0) == 0
    final = tmp_path / "out/checkpoint-final/policies"
    assert sorted(p.name for p in final.iterdir()) == ["rewriter", "writer"]

    async def read() -> list[tuple[object, object]]:
        store = open_store(store_url)
        try:
            rollouts = (await store.query_rollouts(limit=1000)).items
            spans = await store.query_spans([r.rollout_id for r in rollouts], latest_attempt_only=True)
        finally:
            await store.close()
        return [
            (s.attributes.get(semconv.GEN_AI_AGENT_NAME), s.attributes.get(semconv.POLICY_NAME))
            for ss in spans.values()
            for s in ss
            if semconv.TOKEN_SOURCE in s.attributes
        ]

    served = set(asyncio.run(read()))
    assert {("write_query", "writer"), ("check_query", None)} <= served
    assert served <= {("write_query", "writer"), ("rewrite_query", "rewriter"), ("check_query", None)}


def test_a_bad_lora_rank_is_refused_before_anything_starts() -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE / "train.py"), "--policies", "per-role", "--lora-rank", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "--lora-rank: must be a whole number >= 1, got 0" in proc.stderr


def result_history(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_verl_config_composes_with_the_published_setup() -> None:
    from agentbolt_verl import config as verl_config

    cfg = verl_config.compose_verl_config(EXAMPLE / "verl.yaml", extra=["trainer.default_local_dir=/tmp/unused"])
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert cfg.data.train_batch_size == 32 and cfg.actor_rollout_ref.rollout.n == 4
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-6
    assert cfg.agentbolt.lightningrl.agent_match == "^(write_query|rewrite_query)$"


def test_jsonl_export_is_agentbolt_tasks(tmp_path: Path) -> None:
    from agentbolt.types import Task

    data.main(["--data", str(FIXTURES), "--jsonl", str(tmp_path)])
    lines = (tmp_path / "dev.jsonl").read_text().splitlines()
    tasks = [Task.model_validate_json(line) for line in lines]
    assert tasks[0].input["question"] == "What is the average age of all singers from France?"


def test_prompt_shows_the_schema_and_worked_examples_built_from_it() -> None:
    agent = _load("agent")
    task = data.load_split(FIXTURES, "dev")[0]
    messages = agent.few_shot(task)
    assert "CREATE TABLE singer" in messages[0].content
    assert [m.content for m in messages[1:3]] == [
        "How many stadium rows have Capacity at least 10?",
        "<sql>SELECT count(*) FROM stadium WHERE Capacity >= 10</sql>",
    ]
    assert len(messages) == 7  # the system prompt and three worked examples
    no_examples = data.schema_examples(
        {
            "table_names_original": ["t"],
            "column_names_original": [[-1, "*"], [0, "x"]],
            "column_types": ["text", "text"],
        }
    )
    assert no_examples == [] and len(agent.few_shot({**task, "examples": no_examples})) == 1


# -- the graph's routing, against the fake OpenAI backend ------------------------------------------


def _run_graph(writer: str, rewriter: str, checker: str) -> tuple[dict, list[str]]:
    """Run the real graph on a fixture task; the fake backend answers by node (the last user turn)."""
    from langchain_openai import ChatOpenAI

    from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer, Rule

    agent = _load("agent")

    def turn(request) -> str:
        return str(request.messages[-2]["content"] if request.messages[-1]["role"] == "assistant" else "")

    backend = FakeLLM(
        rules=[
            Rule(match=lambda r: turn(r).startswith("Question:"), reply=rewriter),  # rewrite_query
            Rule(match=lambda r: r.messages[-1]["role"] == "assistant", reply=writer),  # write_query
            Rule(match=None, reply=checker),  # check_query
        ]
    )
    task = data.load_split(FIXTURES, "dev")[0]
    task = {**task, "question": "What are the names of singers from France?"}
    with FakeLLMServer(backend) as server:
        llm = ChatOpenAI(base_url=server.base_url, api_key="x", model="fake-model", max_retries=0)
        state = asyncio.run(agent.build_graph(llm, task).ainvoke({"question": task["question"]}))
    kinds = []
    for r in backend.requests:
        if not r.path.endswith("/chat/completions"):
            continue
        body = r.body
        last = body["messages"][-1]
        if last["role"] == "assistant":
            kinds.append("rewrite" if body["messages"][-2]["content"].startswith("Question:") else "write")
            assert body["continue_final_message"] is True and last["content"] == "<sql>SELECT"
        else:
            kinds.append("check")
    return state, kinds


def test_graph_rewrites_a_query_that_fails_then_stops_when_the_checker_agrees() -> None:
    state, kinds = _run_graph(
        writer=" nme FROM singer", rewriter=" Name FROM singer WHERE Country = 'France'", checker=_CORRECT
    )
    assert kinds == ["write", "check", "rewrite", "check"]
    assert state["query"] == "SELECT Name FROM singer WHERE Country = 'France'" and state["rewrites"] == 1


def test_graph_stops_after_two_rewrites_and_ignores_a_rambling_checker() -> None:
    _, kinds = _run_graph(writer=" Name FROM singer", rewriter=" Name FROM singer", checker="WRONG: no filter")
    assert kinds == ["write", "check", "rewrite", "check", "rewrite"]
    state, kinds = _run_graph(writer=" Name FROM singer", rewriter="-", checker="The query is wrong, maybe")
    assert kinds == ["write", "check"] and state["rewrites"] == 0


_CORRECT = "THE QUERY IS CORRECT"
