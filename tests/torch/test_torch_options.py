"""TorchGRPO's option groups: a group or a mapping of its fields, defaults, clear errors."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from agentbolt.errors import UserError
from agentbolt_torch.adapters import LoraSettings
from agentbolt_torch.plugin import _torch_grpo
from agentbolt_torch.training import TorchGRPO, TorchSFT
from agentbolt_torch.training.options import (
    EvaluationOptions,
    GenerationOptions,
    OutputOptions,
    PolicyOptions,
    SamplingOptions,
)


def test_the_constructor_takes_twelve_parameters_at_most() -> None:
    parameters = [p for p in inspect.signature(TorchGRPO.__init__).parameters if p != "self"]
    assert len(parameters) <= 12, parameters


def test_a_group_and_a_mapping_of_its_fields_configure_the_same_run(tmp_path: Path) -> None:
    groups = TorchGRPO(
        "tiny",
        batch_size=2,
        group_size=3,
        sampling=SamplingOptions(temperature=0.7, max_tokens=9, top_p=0.9),
        evaluation=EvaluationOptions(every=2, before=False, samples=3, temperature=0.0, success_threshold=0.5),
        policy=PolicyOptions(lora=LoraSettings(r=4), autocast=None, device="cpu"),
        generation=GenerationOptions(engine={"batch_window_s": 0.01}, swap="drain"),
        output=OutputOptions(out_dir=tmp_path, checkpoint_every=4, resume=tmp_path / "ckpt", plot=False),
        seed=5,
    )
    mappings = _torch_grpo(  # the plugin's factory: Trainer(agent, "torch-grpo", algorithm_config=...)
        model="tiny",
        batch_size=2,
        group_size=3,
        sampling={"temperature": 0.7, "max_tokens": 9, "top_p": 0.9},
        evaluation={"every": 2, "before": False, "samples": 3, "temperature": 0.0, "success_threshold": 0.5},
        policy={"lora": LoraSettings(r=4), "autocast": None, "device": "cpu"},
        generation={"engine": {"batch_window_s": 0.01}, "swap": "drain"},
        output={"out_dir": tmp_path, "checkpoint_every": 4, "resume": tmp_path / "ckpt", "plot": False},
        seed=5,
    )
    for algorithm in (groups, mappings):
        assert algorithm.sampling == {"temperature": 0.7, "max_tokens": 9, "top_p": 0.9}
        assert algorithm.val_sampling == {"temperature": 0.0, "max_tokens": 9, "top_p": 0.9}
        assert (algorithm.val_every, algorithm.val_before, algorithm.val_samples) == (2, False, 3)
        assert algorithm.success_threshold == 0.5
        assert algorithm.lora == LoraSettings(r=4) and algorithm.autocast is None and algorithm.device == "cpu"
        assert algorithm.engine_options == {"max_batch_size": 8, "batch_window_s": 0.01}
        assert algorithm.swap == "drain"
        assert (algorithm.out_dir, algorithm.checkpoint_every, algorithm.resume) == (tmp_path, 4, tmp_path / "ckpt")
        assert algorithm.plot is False and algorithm.seed == 5
        plan = algorithm.plan
        assert (plan.batch_size, plan.group_size, plan.seed, plan.swap) == (2, 3, 5, "drain")
        assert plan.evaluation_sampling_differs and plan.max_staleness is None


def test_defaults() -> None:
    grpo, sft = TorchGRPO("tiny"), TorchSFT("tiny")
    assert grpo.sampling == {"temperature": 1.0, "max_tokens": 64, "top_p": 1.0}
    assert grpo.val_sampling == grpo.sampling and not grpo.plan.evaluation_sampling_differs
    assert (grpo.val_every, grpo.val_before, grpo.val_samples, grpo.success_threshold) == (10, True, 1, 1.0)
    assert grpo.engine_options == {"max_batch_size": 32} and grpo.swap == "inplace"
    assert grpo.out_dir == Path("runs/torch-grpo") and sft.out_dir == Path("runs/torch-sft")
    assert grpo.checkpoint_every is None and grpo.resume is None and grpo.plot is True
    assert (grpo.autocast, grpo.device, grpo.lora) == ("auto", "cpu", None)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"sampling": {"max_token": 8}}, "max_tokens"),  # a misspelt field: the valid ones are listed
        ({"sampling": {"temperature": -1}}, "temperature"),
        ({"evaluation": {"samples": 0}}, "samples"),
        ({"generation": {"swap": "later"}}, "swap"),
        ({"output": "runs/x"}, "OutputOptions"),  # not a group nor a mapping
        ({"max_tokens": 8}, "max_tokens"),  # the flat keywords of before the groups
    ],
)
def test_a_wrong_option_says_what_is_valid(options: dict[str, object], message: str) -> None:
    with pytest.raises((UserError, TypeError), match=message):
        TorchGRPO("tiny", **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("generation", "message"),
    [
        ({"generator": "vllm", "engine": {"max_batch_size": 4}}, r"max_batch_size -> generation\.vllm max_num_seqs"),
        ({"generator": "vllm", "engine": {"prompt_cache_mb": 0}}, r"does not start; got prompt_cache_mb: drop them"),
        ({"vllm": {"kv_cache_gb": 2}}, r"set generator='vllm' to use vLLM, or drop generation\.vllm"),
    ],
)
def test_options_of_the_generator_not_started_are_refused(generation: dict[str, object], message: str) -> None:
    """The own engine's options with vLLM (or vLLM's with the own engine) would configure nothing:
    refused when TorchGRPO is built, before any vLLM server starts (no vLLM needed here)."""
    with pytest.raises(UserError, match=message):
        TorchGRPO("tiny", generation=generation)
    options = GenerationOptions(generator="vllm", vllm={"max_num_seqs": 4}, swap="drain")  # each its own: fine
    assert TorchGRPO("tiny", generation=options).vllm_options == {"max_num_seqs": 4}
