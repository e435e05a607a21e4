"""``agentbolt export --format sft-jsonl`` on a store of real tiny-model runs, loaded back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dashboard_helpers import sql
from typer.testing import CliRunner

from agentbolt.cli import app
from agentbolt.runs.export import IGNORE_INDEX


def _export(tiny_store: str, run_id: str, out: Path, *extra: str) -> str:
    result = CliRunner().invoke(
        app, ["export", "--run", run_id, "--format", "sft-jsonl", "--store", tiny_store, "-o", str(out), *extra]
    )
    assert result.exit_code == 0, result.output
    return result.stderr


def test_sft_jsonl_is_trl_conversational_with_exact_tokens(tiny_store: str, store_db: Path, tmp_path: Path) -> None:
    run_id = sql(store_db, "SELECT run_id FROM runs ORDER BY id LIMIT 1")[0][0]
    out = tmp_path / "sft.jsonl"
    err = _export(tiny_store, run_id, out)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records and f"exported {len(records)} transitions" in err
    for r in records:
        roles = [m["role"] for m in r["messages"]]
        assert roles[-1] == "assistant" and "user" in roles[:-1]
        assert r["input_ids"] == r["prompt_ids"] + r["response_ids"]
        n_prompt = len(r["prompt_ids"])
        assert r["labels"][:n_prompt] == [IGNORE_INDEX] * n_prompt  # loss on the response only
        assert r["labels"][n_prompt:] == r["response_ids"]
        assert len(r["attention_mask"]) == len(r["assistant_masks"]) == len(r["input_ids"])
        assert sum(r["assistant_masks"]) == len(r["response_ids"])

    # the assistant message is the decoded response: the tokens and the chat say the same thing
    from agentbolt_torch.models import tiny_model

    _, tokenizer = tiny_model(seed=0)
    r = records[0]
    reply = r["messages"][-1]["content"]
    assert tokenizer.decode(r["response_ids"], skip_special_tokens=True).strip() == reply.strip()

    # --min-reward keeps the rewarded transitions only
    kept_file = tmp_path / "kept.jsonl"
    _export(tiny_store, run_id, kept_file, "--min-reward", "1.0")
    kept = [json.loads(line) for line in kept_file.read_text().splitlines()]
    assert len(kept) == sum(x["reward"] is not None and x["reward"] >= 1.0 for x in records)

    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset("json", data_files=str(out), split="train")
    assert ds.num_rows == len(records) and {"messages", "input_ids", "labels"} <= set(ds.column_names)
    assert ds[0]["input_ids"] == records[0]["input_ids"]
