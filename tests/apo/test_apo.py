"""APO end to end: real Trainer, SQLite store, runners and gateway; only the two LLMs are fakes
(the policy answers in upper case only when its system prompt asks; the optimizer is scripted)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from pathlib import Path
from typing import Any

import apo_agents
import pytest

from agentbolt import types as t
from agentbolt.errors import UserError
from agentbolt.options import GatewayOptions, RunnerOptions
from agentbolt.plugins import default_plugins
from agentbolt.store import RolloutSearch, open_store
from agentbolt.testing.fake_llm import Failure, FakeLLMServer
from agentbolt.trainer import Trainer
from agentbolt_apo import APO, APOResult
from agentbolt_apo.testing import EditRequest, ScriptedOptimizer

TRAIN = apo_agents.tasks(apo_agents.WORDS[:8])  # 6 letter words, 2 digit words
VAL = apo_agents.tasks(apo_agents.WORDS[8:])  # ocean, piano, candle, 33: the initial prompt scores 0.25
SEED_PROMPT = "Repeat the word you are given."
CRITIQUE = "The expected answers are in upper case, but the prompt never asks for upper case."


def add_uppercase(req: EditRequest) -> str:
    return f"Here you go:\n<prompt>\n{req.prompt}\nWrite the word in UPPERCASE letters.\n</prompt>"


def apo_config(optimizer_url: str, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "initial_prompt": SEED_PROMPT,
        "optimizer_base_url": optimizer_url,
        "optimizer_model": "fake-model",
        "optimizer_api_key_env": None,
        "beam_width": 2,
        "branch_factor": 3,
        "rounds": 2,
        "train_batch_size": 4,
        "model": "fake-model",
    }
    return {**config, **overrides}


def fit(agent: Any, optimizer: ScriptedOptimizer, tmp_path: Path, *, n_runners: int = 0, **overrides: Any) -> Any:
    with FakeLLMServer(apo_agents.policy()) as policy, FakeLLMServer(optimizer.fake_llm()) as opt:
        trainer = Trainer(
            agent,
            algorithm="apo",
            algorithm_config=apo_config(opt.base_url, **overrides),
            store=f"sqlite:///{tmp_path}/apo.db",
            gateway=GatewayOptions(upstreams=policy.base_url),
            runners=RunnerOptions(n=n_runners, concurrency=8),
            progress=True,
        )
        return trainer.fit(TRAIN, VAL)


async def stored(db: Path, versions: list[int]) -> tuple[dict[int, t.Resources], dict[int, int]]:
    """The resources versions, and how many rollouts ran with each version."""
    store = open_store(f"sqlite:///{db}")
    try:
        out = {}
        for v in versions:
            res = await store.get_resources(v)
            assert res is not None
            out[v] = res
        page = await store.search_rollouts(RolloutSearch(limit=1000))
        per_version: dict[int, int] = {}
        for r in page.items:
            assert r.status is t.RolloutStatus.SUCCEEDED and r.resources_version is not None
            per_version[r.resources_version] = per_version.get(r.resources_version, 0) + 1
        return out, per_version
    finally:
        await store.close()


def test_apo_finds_the_prompt_and_the_held_out_score_rises(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # Round 1's three edit requests get: no <prompt> at all, a useless but valid edit, an empty
    # prompt. Round 2's requests (one critique per beam prompt) get the edit that helps.
    optimizer = ScriptedOptimizer(
        critique=CRITIQUE,
        edit=[
            "I would make the prompt friendlier.",
            "<prompt>Repeat the word you are given, politely.</prompt>",
            "<prompt>   </prompt>",
            add_uppercase,
        ],
    )
    with caplog.at_level(logging.WARNING, logger="agentbolt_apo"):
        result = fit(apo_agents.prompt_agent, optimizer, tmp_path, n_runners=1)

    assert isinstance(result, APOResult)
    assert result.score_before == pytest.approx(0.25)
    assert result.score_after == pytest.approx(1.0)
    assert "UPPERCASE" in result.best_prompt and result.best_prompt.startswith("Repeat the word")
    assert result.malformed_answers == 2 and not result.prompt_ignored and not result.warnings
    assert "holds no prompt between <prompt> and </prompt>" in caplog.text

    # The optimizer saw the prompt and the failing tasks with the agent's outputs and rewards.
    assert len(optimizer.critiques) == 3  # round 1: the seed; round 2: the two beam prompts
    first = optimizer.critiques[0]
    assert first.prompt == SEED_PROMPT
    assert "<reward>0</reward>" in first.failures and "<input>" in first.failures and "<output>" in first.failures
    assert "id='12'" not in first.failures and "id='7'" not in first.failures  # digit words succeed
    assert all(e.critique == CRITIQUE for e in optimizer.edits) and len(optimizer.edits) == 9

    # Every version: seed, polite (round 1), two UPPERCASE children (round 2); stored as resources
    # versions with the critique and parent; scores in the result and in the published table.
    by_round = {v.round: [] for v in result.versions}
    for v in result.versions:
        by_round[v.round].append(v)
    assert [len(by_round[r]) for r in (0, 1, 2)] == [1, 1, 2]
    seed, polite = by_round[0][0], by_round[1][0]
    assert seed.prompt == SEED_PROMPT and seed.parent_version is None and seed.critique is None
    assert polite.parent_version == seed.version and polite.critique == CRITIQUE
    assert {c.parent_version for c in by_round[2]} == {seed.version, polite.version}
    assert seed.val_scores == {1: 0.25, 2: 0.25} and polite.val_scores[1] == 0.25
    assert all(c.val_scores == {2: 1.0} and c.final_val_score == 1.0 for c in by_round[2])
    assert seed.train_scores[1] < 1.0

    resources, rollouts = asyncio.run(
        stored(tmp_path / "apo.db", [v.version for v in result.versions] + [result.published_version])
    )
    # Real rollouts pinned to each version; a version never reruns on tasks it was scored on:
    # seed 4 val + 4 train (r1) + 4 train (r2); polite 4 val + 4 train (r2); each child 4 val.
    assert rollouts == {seed.version: 12, polite.version: 8, **{c.version: 4 for c in by_round[2]}}
    for v in result.versions:
        res = resources[v.version]
        assert res.prompts["system"] == v.prompt
        assert res.extra["apo"]["critique"] == v.critique and res.extra["apo"]["parent_version"] == v.parent_version
    final = resources[result.published_version]
    assert final.prompts["system"] == result.best_prompt
    assert final.extra["apo"]["score_before"] == 0.25 and final.extra["apo"]["score_after"] == 1.0
    table = {row["version"]: row for row in final.extra["apo"]["versions"]}
    assert table[seed.version]["final_val_score"] == 0.25 and table[result.best_version]["final_val_score"] == 1.0

    # The run's summary shows the versions, the scores and the best prompt...
    err = capsys.readouterr().err
    assert "APO: versions of resources.prompts['system']" in err
    assert "held-out score 0.250 -> 1.000" in err
    assert "score_after" in err and "UPPERCASE" in err
    # ... and so does `agentbolt runs show` afterwards, from the store.
    from typer.testing import CliRunner

    from agentbolt.cli import app

    url = f"sqlite:///{tmp_path}/apo.db"
    listing = CliRunner().invoke(app, ["runs", "list", "--store", url], env={"COLUMNS": "200"})
    run_id = next(w for w in listing.output.split() if w.startswith("run-"))
    shown = CliRunner().invoke(app, ["runs", "show", run_id, "--store", url], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "APO: versions of resources.prompts['system']" in shown.output
    assert "held-out score 0.250 -> 1.000" in shown.output and f"{result.best_version} *" in shown.output


def test_an_agent_that_ignores_the_prompt_is_detected(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    optimizer = ScriptedOptimizer(critique=CRITIQUE, edit=add_uppercase)
    with caplog.at_level(logging.WARNING, logger="agentbolt_apo"):
        result = fit(apo_agents.deaf_agent, optimizer, tmp_path, rounds=1, branch_factor=1, val_batch_size=2)
    assert len(result.versions) == 2  # the edit was made and evaluated (on 2 tasks, then on all 4)...
    assert result.score_before == result.score_after == pytest.approx(0.25)  # ...and changed nothing
    assert result.prompt_ignored
    message = "every prompt version scored 0.25 on the same validation tasks: does the agent read resources.prompts['system']?"
    assert result.warnings == [message]
    assert message in caplog.text
    resources, _ = asyncio.run(stored(tmp_path / "apo.db", [result.published_version]))
    assert resources[result.published_version].extra["apo"]["warnings"] == [message]


def test_malformed_optimizer_answers_are_skipped_not_fatal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # An empty answer, answers without a prompt, and one dropping the template's placeholder.
    optimizer = ScriptedOptimizer(
        critique=["", CRITIQUE],
        edit=["no prompt here", "<prompt>Say {word} in UPPERCASE</prompt><prompt>", "<prompt>UPPERCASE it</prompt>"],
    )
    with caplog.at_level(logging.WARNING, logger="agentbolt_apo"):
        result = fit(
            apo_agents.prompt_agent,
            optimizer,
            tmp_path,
            initial_prompt="Repeat {word} as you are given it.",
            rounds=2,
            beam_width=1,
        )
    # Round 1's critique is empty: no edits. Round 2: one edit keeps {word} and is used.
    assert [v.round for v in result.versions] == [0, 2]
    assert result.versions[1].prompt == "Say {word} in UPPERCASE"
    assert result.malformed_answers == 3  # the empty critique, the edit with no prompt, the one without {word}
    assert "answered no text" in caplog.text and "drops placeholder(s) ['{word}']" in caplog.text
    assert result.score_after == pytest.approx(1.0)


def test_no_usable_edit_at_all_keeps_the_initial_prompt(tmp_path: Path) -> None:
    optimizer = ScriptedOptimizer(critique=CRITIQUE, edit="Sorry, I cannot help with that.")
    result = fit(apo_agents.prompt_agent, optimizer, tmp_path, rounds=1)
    assert result.best_prompt == SEED_PROMPT and result.score_after == result.score_before == pytest.approx(0.25)
    assert result.malformed_answers == 3 and not result.prompt_ignored
    assert result.warnings and "no usable edited prompt" in result.warnings[0]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_optimizer_is_a_clear_error(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    with FakeLLMServer(apo_agents.policy()) as policy:
        trainer = Trainer(
            apo_agents.prompt_agent,
            algorithm="apo",
            algorithm_config=apo_config(url, rounds=1),
            store=f"sqlite:///{tmp_path}/apo.db",
            gateway=GatewayOptions(upstreams=policy.base_url),
            runners=RunnerOptions(n=0),
            progress=False,
        )
        with pytest.raises(UserError, match=rf"optimizer endpoint {url}/chat/completions cannot be reached"):
            trainer.fit(TRAIN, VAL)


def test_a_refused_key_names_its_environment_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("APO_TEST_OPTIMIZER_KEY", raising=False)
    optimizer = ScriptedOptimizer(edit=add_uppercase)
    backend = optimizer.fake_llm(failures=[Failure(kind="status", status=401, message="invalid api key")])
    with FakeLLMServer(apo_agents.policy()) as policy, FakeLLMServer(backend) as opt:
        trainer = Trainer(
            apo_agents.prompt_agent,
            algorithm="apo",
            algorithm_config=apo_config(opt.base_url, rounds=1, optimizer_api_key_env="APO_TEST_OPTIMIZER_KEY"),
            store="memory://",
            gateway=GatewayOptions(upstreams=policy.base_url),
            runners=RunnerOptions(n=0),
            progress=False,
        )
        with pytest.raises(UserError, match=r"refused the request \(401\).*\$APO_TEST_OPTIMIZER_KEY \(unset\)"):
            trainer.fit(TRAIN, VAL)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"beam_width": 0}, "beam_width must be a whole number of at least 1, got 0"),
        ({"branch_factor": -1}, "branch_factor must be"),
        ({"rounds": 1.5}, "rounds must be"),
        ({"train_batch_size": True}, "train_batch_size must be"),
        ({"val_batch_size": 0}, "val_batch_size must be"),
        ({"initial_prompt": "  "}, "initial_prompt must be a non-empty string"),
        ({"prompt_name": ""}, "prompt_name must be a non-empty string"),
        ({"optimizer_base_url": "localhost:8000/v1"}, "must start with http:// or https://"),
        ({"optimizer_temperature": -0.5}, "optimizer_temperature must be"),
        ({"optimizer_timeout_s": 0}, "optimizer_timeout_s must be more than 0"),
        ({"other_prompts": {"system": "x"}}, "must not contain the optimized prompt 'system'"),
        ({"bem_width": 2}, "unknown APO option(s) 'bem_width'; valid options: initial_prompt, prompt_name"),
    ],
)
def test_bad_options_are_clear_errors(config: dict[str, Any], message: str) -> None:
    trainer = Trainer(
        apo_agents.prompt_agent,
        algorithm="apo",
        algorithm_config=apo_config("http://127.0.0.1:9/v1", **config),
        store="memory://",
        runners=RunnerOptions(n=0),
        progress=False,
    )
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        trainer.fit(TRAIN, VAL)


def test_missing_initial_prompt_and_datasets_are_clear_errors() -> None:
    with pytest.raises(UserError, match="APO needs initial_prompt"):
        default_plugins().algorithms.get("apo")(optimizer_model="m")
    apo = APO("Repeat the word.", optimizer_base_url="http://127.0.0.1:9/v1", optimizer_api_key_env=None)
    trainer = Trainer(
        apo_agents.prompt_agent, algorithm=apo, store="memory://", runners=RunnerOptions(n=0), progress=False
    )
    with pytest.raises(UserError, match="APO needs validation tasks"):
        trainer.fit(TRAIN, [])
    with pytest.raises(UserError, match="APO needs training tasks"):
        trainer.fit([], VAL)


def test_apo_is_registered_by_the_agentbolt_apo_plugin() -> None:
    from typer.testing import CliRunner

    from agentbolt.cli import app

    entry = default_plugins().algorithms.entry("apo")
    assert entry.plugin == "apo" and entry.distribution.startswith("agentbolt-apo ")
    listing = CliRunner().invoke(app, ["plugins", "--json"])
    assert listing.exit_code == 0
    (apo,) = [p for p in json.loads(listing.output) if p["name"] == "apo"]
    assert apo["distribution"] == "agentbolt-apo" and apo["registered"]["algorithms"] == ["apo"]
    core = [p for p in json.loads(listing.output) if p["distribution"] == "agentbolt"]
    assert [p["name"] for p in core] == ["agentbolt.store", "agentbolt.lightningrl"]
    assert not any(p["registered"].get("algorithms") for p in core)


def test_a_busy_optimizer_is_retried(tmp_path: Path) -> None:
    optimizer = ScriptedOptimizer(critique=CRITIQUE, edit=add_uppercase)
    backend = optimizer.fake_llm(failures=[Failure(kind="status", status=503, times=1)])
    with FakeLLMServer(apo_agents.policy()) as policy, FakeLLMServer(backend) as opt:
        result = Trainer(
            apo_agents.prompt_agent,
            algorithm="apo",
            algorithm_config=apo_config(opt.base_url, rounds=1, branch_factor=1),
            store="memory://",
            gateway=GatewayOptions(upstreams=policy.base_url),
            runners=RunnerOptions(n=0),
            progress=False,
        ).fit(TRAIN, VAL)
        answered = len(backend.requests)
    assert result.score_after == pytest.approx(1.0) and result.optimizer_calls == 2
    assert answered == 3  # the critique twice (503, then answered), the edit once


def test_an_agent_that_calls_no_llm_through_the_gateway_is_optimized_too(tmp_path: Path) -> None:
    optimizer = ScriptedOptimizer(critique=CRITIQUE, edit=add_uppercase)
    with FakeLLMServer(optimizer.fake_llm()) as opt:
        result = Trainer(
            apo_agents.no_llm_agent,
            algorithm="apo",
            algorithm_config=apo_config(opt.base_url, rounds=1, branch_factor=1),
            store=f"sqlite:///{tmp_path}/apo.db",
            runners=RunnerOptions(n=0),
            progress=False,
        ).fit(TRAIN, VAL)
    assert (result.score_before, result.score_after) == (pytest.approx(0.25), pytest.approx(1.0))
    assert "(no LLM reply was recorded for this task)" in optimizer.critiques[0].failures
