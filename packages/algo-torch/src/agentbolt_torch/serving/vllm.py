"""vLLM as the generator: a vLLM server the trainer starts, owns and keeps in step with the policy.

:class:`VLLMGenerator` implements :class:`~agentbolt_torch.generation.generator.Generator` with a
vLLM OpenAI server in a child process (:mod:`.vllm_process`; vLLM in its own environment) behind a
small relay in this process (:mod:`.vllm_front`), which stamps each call with the policy version
and holds calls while the weights change. What it does, step by step:

- **start**: the policy's weights, config and tokenizer (with its chat template) are written to
  ``work_dir/model`` (:mod:`.vllm_weights`) and served under the policy's name; with LoRA the
  frozen base is served as ``<name>-base`` and each adapter is loaded at run time under its name
  (one adapter: the policy's name; per-role adapters: the role names, and the policy's name is an
  adapter of zero weights, i.e. the base model: see ``_zero_base``). The server log is ``work_dir/vllm.log``.
- **sampling** means what it means on agentbolt's engine: ``temperature`` (0: greedy),
  ``top_p``, ``top_k`` (0: off), ``max_tokens``, ``stop``, ``seed``, ``n`` are vLLM's own
  parameters with the same meaning; the logprobs are of the unmodified policy (vLLM's
  ``--logprobs-mode raw_logprobs``, agentbolt's ``logprobs_mode="raw"``; ``"processed"`` maps to
  ``processed_logprobs``). The same seed does not give the same tokens on both generators
  (different random streams).
- **weight sync, synchronous training** (:meth:`pause` → update → :meth:`resume`): the front stops
  admitting calls and drains them, vLLM pauses; on resume, what the update changed is written and
  loaded in place: full weights with ``collective_rpc("reload_weights")`` from the folder, LoRA
  adapters with ``/v1/load_lora_adapter`` (``load_inplace``); then the prefix cache is reset
  (reloading leaves it stale), vLLM resumes and the front stamps calls with the new versions.
- **asynchronous training** (``max_staleness``): vLLM *is* the serving copy (:meth:`serve_copy` has
  nothing to copy); :meth:`swap_weights` syncs as above, with ``drain=True`` after the calls in
  flight finish, with ``drain=False`` while vLLM holds them (``/pause?mode=keep``): they continue
  on the new weights and keep the version they were admitted with (the conservative one, as on
  agentbolt's engine).

Needs vLLM's dev-mode endpoints (``VLLM_SERVER_DEV_MODE=1``, set for the child process only);
the endpoints listen on 127.0.0.1. Measured costs on a 2-core CPU: docs/generators.md.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from agentbolt.errors import UserError

from ..generation.engine_io import EngineStats
from ..generation.serving_copy import SwapResult
from .vllm_front import AdmissionGate, VLLMFront
from .vllm_process import VLLMProcess, find_vllm_python
from .vllm_weights import export_base, write_adapter, write_full_weights

if TYPE_CHECKING:
    from ..policy import Policy

__all__ = ["VLLMGenerator"]

log = logging.getLogger(__name__)

_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
_LOGPROBS_MODES = {"raw": "raw_logprobs", "processed": "processed_logprobs"}


class VLLMGenerator:
    """A vLLM server serving ``policy`` as a :class:`~agentbolt_torch.generation.generator.Generator`
    (module doc: what each step does).

    Args:
        policy: the policy being trained (its weights are copied to vLLM after each update).
        work_dir: where the served model folder, adapters and ``vllm.log`` go (default: a
            temporary folder, removed by :meth:`stop`).
        python: the interpreter with vLLM (default: :func:`~agentbolt_torch.serving.vllm_process.find_vllm_python`).
        dtype: vLLM's ``--dtype`` (default: the policy's autocast dtype, else ``float32``).
        max_model_len: context length (default: the policy's).
        kv_cache_gb: the CPU KV cache in whole GiB (``VLLM_CPU_KVCACHE_SPACE``; ignored on CUDA).
        max_num_seqs: most sequences vLLM decodes together.
        logprobs_mode: ``"raw"`` (default) or ``"processed"``, as on agentbolt's engine.
        seed: vLLM's ``--seed``.
        startup_timeout_s: longest wait for the server (a cold start on CPU takes minutes).
        extra_args: more vLLM server arguments.
        host, port: where the front listens (``port=0``: a free port); vLLM listens on a free port
            of ``host``.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        work_dir: str | os.PathLike[str] | None = None,
        python: str | os.PathLike[str] | None = None,
        dtype: str | None = None,
        max_model_len: int | None = None,
        kv_cache_gb: int = 1,
        max_num_seqs: int | None = None,
        logprobs_mode: str = "raw",
        seed: int = 0,
        startup_timeout_s: float = 900.0,
        extra_args: Sequence[str] = (),
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if kv_cache_gb < 1 or int(kv_cache_gb) != kv_cache_gb:
            raise UserError(
                f"kv_cache_gb must be a whole number of GiB, at least 1 (vLLM's CPU KV cache), got {kv_cache_gb}"
            )
        if logprobs_mode not in _LOGPROBS_MODES:
            raise UserError(f"logprobs_mode must be 'raw' or 'processed', got {logprobs_mode!r}")
        self.policy = policy
        self.python = find_vllm_python(python)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if work_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="agentbolt-vllm-")
            work_dir = self._tmp.name
        self.work_dir = Path(work_dir)
        self.model_dir = self.work_dir / "model"
        self.adapter_names: tuple[str, ...] = (
            tuple(policy.adapters) if policy.adapters else ((str(policy.name),) if policy.is_lora else ())
        )
        """The LoRA adapters served (model name = adapter name)."""
        self._base_name = f"{policy.name}-base" if policy.is_lora else str(policy.name)
        self._zero_base = bool(policy.adapters)
        """Per-role adapters: the base model is served under the policy's name as an adapter of
        zero weights, so every call runs with an adapter: vLLM 0.32's CPU build gave base-model rows
        batched with LoRA rows wrong logprobs (off by up to 7 nats, tests/torch/test_vllm_roles.py)."""
        self.dtype = dtype or _dtype_name(policy.autocast_dtype)
        self.startup_timeout_s = startup_timeout_s
        args = [
            "--dtype", self.dtype,
            "--max-model-len", str(max_model_len or policy.max_model_len),
            "--logprobs-mode", _LOGPROBS_MODES[logprobs_mode],
            "--seed", str(seed),
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        ]  # fmt: skip
        if max_num_seqs is not None:
            args += ["--max-num-seqs", str(max_num_seqs)]
        if self.adapter_names:
            args += [
                "--enable-lora",
                "--max-loras", str(len(self.adapter_names) + (1 if policy.adapters else 0)),
                "--max-lora-rank", str(_lora_rank(self._adapter_rank())),
            ]  # fmt: skip
        self.process = VLLMProcess(
            python=self.python,
            model_dir=self.model_dir,
            served_model_name=self._base_name,
            log_path=self.work_dir / "vllm.log",
            args=[*args, *extra_args],
            env={"VLLM_CPU_KVCACHE_SPACE": str(int(kv_cache_gb))},
            host=host,
        )
        self.gate = AdmissionGate(adapters=frozenset(self.adapter_names) if policy.adapters else frozenset())
        self.front = VLLMFront("", self.gate, host=host, port=port)
        self._http: httpx.Client | None = None
        self._synced: tuple[int, dict[str, int]] | None = None
        """(weights generation, versions) of what vLLM holds."""
        self.sync_seconds: list[float] = []
        """Duration of each weight sync (write + load + cache reset)."""

    # -- Generator -------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return self.front.base_url

    @property
    def served_model_name(self) -> str:
        return str(self.policy.name)

    def start(self) -> str:
        """Write the model, start vLLM (minutes on a CPU; progress in the log), load the adapters,
        start the front; returns :attr:`base_url`."""
        if self._http is not None:
            return self.base_url
        self.work_dir.mkdir(parents=True, exist_ok=True)
        export_base(self.policy, self.model_dir)
        self.process.start(timeout=self.startup_timeout_s)
        self._http = httpx.Client(base_url=self.process.url, timeout=600.0)
        try:
            for name in self.adapter_names:
                self._load_adapter(name, inplace=False)
            if self._zero_base:
                folder = write_adapter(
                    self.policy, self.policy.adapters[0], self.work_dir / "adapters" / "_base", zero=True
                )
                self._post("/v1/load_lora_adapter", json={"lora_name": str(self.policy.name), "lora_path": str(folder)})
            self._synced = self._wanted()
            self.gate.resume(*self._stamps())
            self.front.upstream = self.process.url
            self.front.start()
        except BaseException:
            self.stop()
            raise
        log.info("vLLM generator for %s at %s (vLLM on %s)", self.policy.name, self.base_url, self.process.url)
        return self.base_url

    def stop(self) -> None:
        self.front.stop()
        if self._http is not None:
            self._http.close()
            self._http = None
        self.process.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def pause(self, *, drain: bool = True, timeout: float | None = None) -> None:
        self.gate.pause()
        if drain and not self.gate.wait_idle(timeout):
            self.gate.resume()
            raise TimeoutError(f"calls still in flight after {timeout} s")
        self._post("/pause", params={"mode": "wait" if drain else "keep"})

    def resume(self) -> None:
        try:
            self._sync()
        finally:
            self._post("/resume")
            self.gate.resume(*self._stamps())

    def serve_copy(self) -> None:
        """vLLM already serves its own copy of the weights: nothing to do."""
        return None

    def swap_weights(self, *, drain: bool = True, timeout: float | None = None) -> SwapResult:
        previous = self.gate.default_version
        started = time.monotonic()
        self.pause(drain=drain, timeout=timeout)
        carried = self.gate.inflight
        paused = time.monotonic()
        self.resume()
        return SwapResult(
            version=self.gate.default_version,
            previous_version=previous,
            drain=drain,
            wait_s=paused - started,
            copy_s=time.monotonic() - paused,
            carried_rows=carried,
        )

    @property
    def stats(self) -> EngineStats:
        return replace(self.gate.stats)

    def state(self) -> dict[str, Any]:
        return {
            "generator": "vllm",
            "paused": self.gate.paused,
            "queued": self.gate.waiting,
            "active_requests": self.gate.inflight,
            "served_version": self.gate.default_version,
            "running": self.process.running(),
            "vllm_pid": self.process.pid,
            "log": str(self.process.log_path),
        }

    # -- weight sync -----------------------------------------------------------------------------

    def _adapter_rank(self) -> int:
        policy = self.policy
        model = policy.model
        configs = getattr(model, "peft_config", {})
        return max((int(c.r) for c in configs.values()), default=16)

    def _wanted(self) -> tuple[int, dict[str, int]]:
        policy = self.policy
        versions = {name: policy.version_of(name) for name in policy.adapters}
        return policy.weights_generation, {**versions, "": policy.version}

    def _stamps(self) -> tuple[dict[str, int], int]:
        """The versions the front stamps calls with: per adapter (policies by role), and the rest."""
        assert self._synced is not None
        versions = dict(self._synced[1])
        overall = versions.pop("")
        return versions, overall

    def _sync(self) -> None:
        """Load into vLLM what changed since the last sync (vLLM is paused)."""
        wanted = self._wanted()
        if wanted == self._synced:
            return
        started = time.monotonic()
        policy = self.policy
        if policy.adapters:
            before = self._synced[1] if self._synced else {}
            for name in policy.adapters:
                if before.get(name) != wanted[1][name]:
                    self._load_adapter(name, inplace=True)
        elif policy.is_lora:
            self._load_adapter(str(policy.name), inplace=True)
        else:
            write_full_weights(policy, self.model_dir)
            self._post(
                "/collective_rpc", json={"method": "reload_weights", "kwargs": {"weights_path": str(self.model_dir)}}
            )
        reset = self._post("/reset_prefix_cache", params={"reset_running_requests": "true"})
        if not reset.get("success", True):
            log.warning("vLLM could not reset its prefix cache after a weight sync (calls held in flight)")
        self._synced = wanted
        self.sync_seconds.append(time.monotonic() - started)
        log.debug("vLLM weights synced to version %s in %.2f s", wanted[1], self.sync_seconds[-1])

    def _load_adapter(self, name: str, *, inplace: bool) -> None:
        source = name if self.policy.adapters else "default"  # peft names a single adapter "default"
        folder = write_adapter(self.policy, source, self.work_dir / "adapters" / name)
        body = {"lora_name": name, "lora_path": str(folder), "load_inplace": inplace}
        self._post("/v1/load_lora_adapter", json=body)

    def _post(self, path: str, **kwargs: Any) -> dict[str, Any]:
        if self._http is None:
            raise RuntimeError("the vLLM generator is not started")
        answer = self._http.post(path, **kwargs)
        if answer.status_code != 200:
            raise RuntimeError(
                f"vLLM {path} answered {answer.status_code}: {answer.text[:500]} (server log: {self.process.log_path})"
            )
        try:
            data = answer.json()
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.") if dtype is not None else "float32"


def _lora_rank(r: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds rank ``r``."""
    for rank in _LORA_RANKS:
        if rank >= r:
            return rank
    raise UserError(f"LoRA rank {r} is above vLLM's largest ({_LORA_RANKS[-1]})")
