"""``torch-grpo`` with vLLM as the generator, end to end on a tiny model, with one policy and with
policies by role (Trainer -> store -> runner -> agent -> gateway -> vLLM -> LightningRL -> update
-> weights reloaded into vLLM), in the asynchronous mode: vLLM serves while the policy trains, the
weights are swapped into it after each update, and the staleness bound holds (the ledger of
tests/torch/test_torch_async.py, the same checks as on agentbolt's own generator). Marked
``vllm``: run with ``./dev vllm``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from vllm_support import serving_part, vllm_python_or_skip, vllm_tiny

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]  # a cold vLLM start: minutes on a loaded CPU
PYTHON = vllm_python_or_skip()

from test_torch_async import check_async_ledger  # noqa: E402


def test_async_training_on_vllm_keeps_the_bound_and_records_every_version(tmp_path: Path) -> None:
    model, tokenizer = vllm_tiny(seed=0)
    model_dir = tmp_path / "tiny32"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    vllm = {"python": PYTHON, "dtype": "float32", "max_model_len": 512, "work_dir": tmp_path / "vllm"}
    check_async_ledger(tmp_path, "inplace", model=str(model_dir), generation={"generator": "vllm", "vllm": vllm})
    log = (tmp_path / "vllm" / "vllm.log").read_text()
    assert "Application startup complete" in log and "Traceback" not in serving_part(log)  # no error while serving


def test_async_training_on_vllm_with_policies_by_role_bounds_each_adapter(tmp_path: Path) -> None:
    """The same ledger with two policies by role: one base in vLLM, one LoRA adapter per role
    loaded in place after each update, each call stamped and bounded by its own adapter's version."""
    model, tokenizer = vllm_tiny(seed=0)
    model_dir = tmp_path / "tiny32"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    vllm = {"python": PYTHON, "dtype": "float32", "max_model_len": 512, "work_dir": tmp_path / "vllm"}
    algorithm = check_async_ledger(
        tmp_path, "inplace", model=str(model_dir), generation={"generator": "vllm", "vllm": vllm}, roles=True
    )
    assert max(version for version, _ in algorithm.trained) == 5
    log = (tmp_path / "vllm" / "vllm.log").read_text()
    assert "Application startup complete" in log and "Traceback" not in serving_part(log)
