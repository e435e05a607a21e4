"""The RAG example (examples/rag_agent): loaders on MuSiQue-format fixtures, the FTS5 index, the
reward, the agent through the gateway (fake LLM) and two training steps of the tiny model.

The example's modules are loaded under unique names (the three examples all have an agent.py
and a data.py); everything that imports ``agent.py`` runs in a subprocess.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.lightningrl import LightningRL
from agentbolt.store import open_store

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples/rag_agent"
FIXTURES = Path(__file__).parent / "fixtures/rag_agent"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"rag_agent_example_{name}", EXAMPLE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


data = _load("data")
retrieval = _load("retrieval")
reward = _load("reward")


# -- loaders ---------------------------------------------------------------------------------------


def test_loader_reads_musique_files() -> None:
    train, dev = data.load_split(FIXTURES, "train"), data.load_split(FIXTURES, "dev")
    assert [q.id for q in train] == ["2hop__13548_13529", "2hop__40421_77003"]
    assert [q.id for q in dev] == ["2hop__460946_294723"]  # the unanswerable row is left out
    q = train[1]
    assert q.answer == "Steventon" and q.answer_aliases == ["Steventon, Hampshire"]
    assert [p.is_supporting for p in q.paragraphs] == [True, True, False]
    assert [s.paragraph_support_idx for s in q.question_decomposition] == [0, 1]
    tasks = data.to_tasks(train, Path("/x/index.sqlite"))
    assert tasks[0]["answers"] == ["River Sherbourne", "Sherbourne", "the Sherbourne"]
    assert tasks[0]["index"] == "/x/index.sqlite" and tasks[0]["task_id"] == "2hop__13548_13529"
    # the corpus is every distinct paragraph of both files (Leiden appears twice in dev)
    assert len(data.corpus([*train, *dev, *data.read_jsonl(FIXTURES / data.DEV_FILE)])) == 9


def test_a_malformed_row_names_file_and_line() -> None:
    with pytest.raises(data.DataError, match=r"malformed/musique_ans_v1\.0_dev\.jsonl:2: .*answer: Field required"):
        data.load_split(FIXTURES / "malformed", "dev")
    with pytest.raises(data.DataError, match=r"musique_ans_v1\.0_train\.jsonl:2: "):
        data.load_split(FIXTURES / "malformed", "train")


def test_a_missing_file_says_where_to_get_the_data(tmp_path: Path) -> None:
    with pytest.raises(data.DataError, match=r"musique_ans_v1\.0_train\.jsonl.*github\.com/StonyBrookNLP/musique"):
        data.load_split(tmp_path, "train")


def test_bundled_data_is_deterministic_and_large_enough(tmp_path: Path) -> None:
    a, b = data.write_bundled(tmp_path / "a"), data.write_bundled(tmp_path / "b")
    for name in (data.TRAIN_FILE, data.DEV_FILE):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    train, dev = data.load_split(a, "train"), data.load_split(a, "dev")
    assert len(train) >= 200 and len(dev) >= 100
    assert not {q.id for q in train} & {q.id for q in dev}
    for q in dev[:20]:  # two hops, each supported by a paragraph that holds its answer
        assert len(q.question_decomposition) == 2
        for hop in q.question_decomposition:
            paragraph = q.paragraphs[hop.paragraph_support_idx]
            assert paragraph.is_supporting and hop.answer in paragraph.paragraph_text
        assert q.question_decomposition[1].answer == q.answer


def test_bundled_heldout_entities_never_occur_in_training(tmp_path: Path) -> None:
    """Every dev person, work, city and university is absent from the whole training file."""
    folder = data.write_bundled(tmp_path / "data")
    train_text = (folder / data.TRAIN_FILE).read_text(encoding="utf-8")
    dev = data.load_split(folder, "dev")
    entities = set()
    for q in dev:
        person = q.question_decomposition[0].answer
        work = re.search(r" of (.+?) (?:born|attend)\?$", q.question).group(1)
        entities |= {person, work, q.answer, *q.answer_aliases}
        for p in q.paragraphs:  # distractors come from the same split
            entities.add(p.title)
    assert len(entities) > 250
    leaked = sorted(e for e in entities if e in train_text)
    assert leaked == []


def test_bundled_answers_hold_no_generic_word(tmp_path: Path) -> None:
    """No answer or alias holds a word a rule could answer without reading ("City", "University", ...)."""
    folder = data.write_bundled(tmp_path / "data")
    questions = [*data.load_split(folder, "train"), *data.load_split(folder, "dev")]
    for q in questions:
        for answer in (q.answer, *q.answer_aliases):
            words = set(reward.normalize_answer(answer).split())
            assert words and not words & data.GENERIC_WORDS, (q.id, answer)
            assert answer.lower() not in q.question.lower()  # never in the question either


# -- the index -------------------------------------------------------------------------------------


def test_index_is_built_cached_rebuilt_and_finds_the_paragraph(tmp_path: Path) -> None:
    folder = data.write_bundled(tmp_path / "data")
    questions = [*data.load_split(folder, "train"), *data.load_split(folder, "dev")]
    paragraphs = data.corpus(questions)
    path = tmp_path / "index.sqlite"
    assert retrieval.build_index(paragraphs, path) is True
    mtime = path.stat().st_mtime_ns
    assert retrieval.build_index(paragraphs, path) is False and path.stat().st_mtime_ns == mtime  # cached
    index = retrieval.SearchIndex(path)
    found = 0
    for q in questions[-50:]:
        texts = [h.text for h in index.search(q.question, k=3)]
        supporting = {p.paragraph_text for p in q.paragraphs if p.is_supporting}
        found += supporting <= set(texts)
    assert found >= 45, f"both supporting paragraphs in the top 3 for only {found}/50 questions"
    hits = index.search("Lina Dorwick Copper Kettle")  # not in the corpus: no exception, other paragraphs
    assert all(isinstance(h.score, float) for h in hits)
    assert index.search("?!") == []
    assert retrieval.build_index([*paragraphs, ("New", "A new paragraph about Zorblax.")], path) is True
    assert [h.title for h in retrieval.SearchIndex(path).search("Zorblax", k=1)] == ["New"]


def test_index_on_the_real_format_fixtures(tmp_path: Path) -> None:
    questions = [*data.load_split(FIXTURES, "train"), *data.load_split(FIXTURES, "dev")]
    path = tmp_path / "real.sqlite"
    retrieval.build_index(data.corpus(questions), path)
    (best,) = retrieval.SearchIndex(path).search("Where was Jane Austen born?", k=1)
    assert best.title == "Jane Austen"


# -- the reward --------------------------------------------------------------------------------------


def test_exact_match_and_scores() -> None:
    answers = ["River Sherbourne", "Sherbourne"]
    assert reward.exact_match("the river sherbourne!", answers) == 1.0  # SQuAD normalisation, an alias
    assert reward.exact_match("Sherbourne river", answers) == 0.0  # F1 1.0 against the gold, not exact
    assert reward.scores("<answer>River Thames</answer>", answers) == pytest.approx(
        {"reward": 0.1 + 0.9 * 0.5, "exact_match": 0.0, "f1": 0.5}
    )
    assert reward.scores("no tag", answers) == {"reward": 0.0, "exact_match": 0.0, "f1": 0.0}


def test_reward_is_f1_over_aliases_plus_format() -> None:
    answers = ["River Sherbourne", "Sherbourne"]
    assert reward.reward("<answer>the River Sherbourne.</answer>", answers) == 1.0
    assert reward.reward("<answer>Sherbourne</answer>", answers) == 1.0  # an alias
    assert reward.reward("<answer>River Thames</answer>", answers) == pytest.approx(0.1 + 0.9 * 0.5)
    assert reward.reward("<answer>Coventry</answer>", answers) == pytest.approx(0.1)
    assert reward.reward("River Sherbourne", answers) == 0.0  # no tag, no reward
    assert reward.reward("<answer>x</answer> then <answer>Sherbourne</answer>", answers) == 1.0  # the last one
    for value in (0.0, 0.1, 0.55, 1.0):
        assert reward.f1_from_reward(value) == pytest.approx({0.0: 0.0, 0.1: 0.0, 0.55: 0.5, 1.0: 1.0}[value])


# -- the agent, end to end ----------------------------------------------------------------------------


@pytest.mark.timeout(900)
def test_agent_searches_and_answers_through_the_gateway(tmp_path: Path) -> None:
    """A scripted model that searches then answers from the result: reward 1, two exact transitions each."""
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).parent / "rag_agent_fake_llm.py"), str(tmp_path / "cache"), "6"],
        capture_output=True,
        text=True,
        timeout=900,  # a loaded 2-core machine: minutes; pytest-timeout caps the test itself
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads(proc.stdout.strip().splitlines()[-1])
    assert run["rewards"] == [1.0] * 6  # the index returned the paragraph holding each answer
    # one final reward per question, with the held-out metrics as dimensions beside the training reward
    assert run["dimensions"] == [{"reward": 1.0, "exact_match": 1.0, "f1": 1.0}] * 6
    assert run["tools"] == ["search"] * 6
    assert run["gateway_calls"] == 12 and len(run["transitions"]) == 12 and run["excluded"] == {}
    assert {(tr["agent"], tr["source"]) for tr in run["transitions"]} == {("researcher", "exact")}
    assert run["apis"] == ["responses"]  # the SDK's default model speaks the Responses API


@pytest.mark.timeout(900)
def test_train_script_two_steps_on_the_tiny_model(tmp_path: Path) -> None:
    """The README's command, shrunk: every LLM call of a training rollout is a transition or an exclusion.

    The random tiny model, saved as a model directory with room for the few-shot prompt (its
    byte-level tokenizer makes the prompt twice as long as SmolLM2's; ``--model tiny`` has 1,024).
    """
    from agentbolt_torch.models import tiny_model

    model, tokenizer = tiny_model(max_position_embeddings=4096)
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    store_url = f"sqlite:///{tmp_path}/rag.db"
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE / "train.py"),
            *("--model", str(tmp_path / "tiny"), "--steps", "2", "--val", "4", "--batch-size", "2", "--no-progress"),
            *("--store", store_url, "--out", str(out), "--cache-dir", str(tmp_path / "cache")),
        ],
        capture_output=True,
        text=True,
        timeout=900,  # a loaded 2-core machine: minutes; pytest-timeout caps the test itself
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "held-out exact match" in proc.stdout and "answer F1" in proc.stdout and "search called in" in proc.stdout
    assert "steps without an update (no transition): none; failed training rollouts: 0" in proc.stdout
    result = json.loads((out / "result.json").read_text())
    assert result["example"] == "rag_agent" and result["steps"] == 2 and result["headline"] == "dev/exact_match"
    dev = result["heldout"]["dev"]
    assert dev["n"] == 4 and dev["metric"] == "exact_match"
    for stage in ("before", "after"):
        assert {"score", "se", "f1", "f1_se", "tool_call_rate", "failed"} <= dev["stages"][stage].keys()
    extra = result["extra"]
    assert extra["exact_token_id_share"] == 1.0 and extra["skipped_steps"] == [] and extra["failed_train_rollouts"] == 0
    assert extra["calls_per_rollout"] >= 1.0 and extra["transitions_per_rollout"] == extra["calls_per_rollout"]
    assert (out / "curve.png").is_file() and (out / "metrics.jsonl").is_file()

    async def check() -> None:
        store = open_store(store_url)
        try:
            rollouts = [r for r in (await store.query_rollouts(limit=1000)).items if r.mode is t.RolloutMode.TRAIN]
            assert len(rollouts) == 2 * 2 * 4  # steps x tasks x group size
            assert all(r.status is t.RolloutStatus.SUCCEEDED for r in rollouts)
            spans = await store.query_spans([r.rollout_id for r in rollouts], latest_attempt_only=True)
            batch = LightningRL(credit="final", advantage="grpo", allow_empty=True).process(rollouts, spans)
            calls = {
                s.span_id: s for ss in spans.values() for s in ss if semconv.TOKEN_SOURCE in s.attributes
            }  # the gateway's LLM-call spans
            assert calls and batch.report.calls == len(calls)
            excluded = {e.span_id: e.reason for e in batch.report.examples}
            trained = {tr.span_id for tr in batch.transitions}
            assert len(trained) + sum(batch.report.excluded.values()) == len(calls)
            for span_id in calls:
                assert span_id in trained or excluded.get(span_id), f"call {span_id}: neither trained nor excluded"
            for tr in batch.transitions:
                span = calls[tr.span_id]
                assert tr.token_source is t.TokenSource.EXACT and tr.agent_name == "researcher"
                assert list(tr.prompt_ids) == list(span.attributes[semconv.PROMPT_TOKEN_IDS])
                assert list(tr.response_ids) == list(span.attributes[semconv.RESPONSE_TOKEN_IDS])
        finally:
            await store.close()

    asyncio.run(check())


def test_verl_config_composes() -> None:
    pytest.importorskip("agentbolt_verl")
    from agentbolt_verl import config as c

    cfg = c.compose_verl_config(EXAMPLE / "verl.yaml", extra=["trainer.total_training_steps=2"])
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-1.5B-Instruct"
    assert cfg.actor_rollout_ref.rollout.n == 4 and cfg.data.train_batch_size == 32
    assert cfg.actor_rollout_ref.actor.optim.lr == 1.0e-6
    assert c.settings_from_verl_config(cfg).data.val.endswith("val.jsonl")
