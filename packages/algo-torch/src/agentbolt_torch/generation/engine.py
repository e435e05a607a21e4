"""Batched generation from the policy being trained (the engine behind the policy server).

The request and result types are in :mod:`agentbolt_torch.generation.engine_io` (re-exported here), the
sampling of a batch in :mod:`agentbolt_torch.generation.sampling`; this module is the scheduler: admission,
prefill, the prompt cache, joining the running batch and decode steps, on one engine thread.

Design (continuous batching, one engine thread):

- Requests are submitted from any thread (the HTTP server's event loop, a test, an evaluation
  loop) and queue up. When the engine is idle it waits ``batch_window_s`` after the first
  arrival so that concurrent requests start together.
- New requests are **prefilled** together: prompts are left-padded into one batch (chunked by
  ``max_prefill_tokens``), run once with a fresh KV cache, and a request with ``n > 1`` is
  prefilled once and its cache rows repeated ``n`` times.
- **Prompt cache** (exact match): each distinct prompt is run once per prefill, and the KV cache
  rows and last-position logits of recent prompts are kept (LRU, ``prompt_cache_mb``) for the
  current weights; a later request with the same token ids skips its prefill. The samples of a
  GRPO group are separate requests with one prompt, so a group costs one prompt pass. The cache
  is emptied whenever the weights or the policy version change.
- The prefilled rows **join the running batch** between decode steps: the two KV caches are
  left-padded to the same length and concatenated, so requests that arrive while others are
  generating do not wait for them to finish. Position ids always come from the attention mask
  (``cumsum - 1`` over real tokens), so padding never shifts positions.
- Each **decode step** feeds every active row its last sampled token. Rows carry their own
  ``max_tokens``, temperature, top-p, top-k, stop strings, stop token ids and seed. A row that
  finishes (eos, stop string, stop token, ``max_tokens``, cancellation) is dropped from the
  batch and its KV cache immediately, so it stops consuming compute; leading padding columns
  that no active row needs any more are trimmed.
- Every forward pass runs under :attr:`Policy.lock <agentbolt_torch.policy.Policy.lock>`, in
  ``torch.inference_mode`` and the policy's autocast, so an update never races generation.
  :meth:`GenerationEngine.pause` additionally stops admitting requests and, by default, drains
  the in-flight ones, so every response is sampled by a single policy version; a drained pause
  also frees the caches that depend on the weights (cast copies, prompt cache) for the update.
- For asynchronous training, :meth:`GenerationEngine.serve_copy` makes generation read a copy
  of the trainable weights under the copy's own lock, so the updater trains the policy at the
  same time; :meth:`GenerationEngine.swap_weights` copies the new weights in at a version
  boundary, draining the calls in flight or in place (:mod:`agentbolt_torch.generation.serving_copy`).
- With bf16/fp16 autocast, the weights of every ``nn.Linear`` are cast to the autocast dtype
  **once per policy version** (not on every decode step, which is what autocast alone would do
  and which doubles decode time on CPU) and the forward runs through
  ``torch.func.functional_call`` with those casts. The numerics are bit-identical to autocast
  over the fp32 weights (the same rounding, the same kernels); the copies are rebuilt whenever
  the updater marks the weights changed (:meth:`Policy.mark_weights_changed`) or the version
  changes. Embeddings and norms stay fp32.
- Under autocast the KV caches store keys in the autocast dtype, the dtype attention reads
  them in (:mod:`agentbolt_torch._kv_caches`): bit-identical logits, a third less cache
  memory, and no cast of every layer's key cache on every decode step.
- Grouped-query attention shares the key/value heads inside PyTorch's kernel instead of copying
  them for every query head on every decode step (:mod:`agentbolt_torch.attention`; the policy
  switches an ``sdpa`` model to it): the same logits bit for bit, less memory churned per step.

CPU notes: one forward pass per decode step serves the whole batch, so throughput grows almost
linearly with concurrent requests (SmolLM2-135M, fp32, 2 cores without bf16 units: about 19
tokens/s for one request, 90 for 16, 156 for 32; ``benchmarks/torch_policy.py``). PyTorch's
OpenMP threads spin while waiting; when other processes (agents, runners) compete for the same
few cores, ``torch.set_num_threads(1)`` or ``OMP_WAIT_POLICY=PASSIVE`` can be several times
faster than the default.

Logprob convention (``logprobs_mode``):

- ``"raw"`` (default): the reported logprob of a sampled token is ``log_softmax(logits)`` of the
  **unmodified policy** (temperature 1, no top-p/top-k truncation), i.e. log pi_theta(a|s). This
  is exactly what :mod:`agentbolt_torch.update.updater` recomputes for the PPO importance ratio, so on
  policy the ratio is 1 up to numerical noise. When the request samples at temperature 1 with
  top_p = 1 and top_k = 0 (the recommended RL setting), this is also the distribution the token
  was drawn from. ``top_logprobs`` use the same distribution.
- ``"processed"``: the logprob under the distribution actually sampled from (logits divided by
  the temperature, then top-k/top-p truncated and renormalized; greedy gives 0.0). Use it with
  :attr:`UpdateConfig.logit_temperature <agentbolt_torch.update.updater.UpdateConfig.logit_temperature>`
  equal to the sampling temperature and no truncation, otherwise the ratio is not on-policy.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import random
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from agentbolt.errors import UserError

from ..adapters import BASE, check_names
from ._kv import cache_concat, cache_layers, cache_select, cache_trim_left, pad_left, pad_seq_left
from .engine_io import (
    Completion,
    EngineStats,
    Finished,
    LogprobsMode,
    RequestHandle,
    SamplingParams,
    TokenStep,
)
from .sampling import find_stop, held_back, sample_tokens
from .serving_copy import ServingWeights, SwapResult
from .token_text import decode_text

if TYPE_CHECKING:
    import torch

    from ..policy import Policy

__all__ = [
    "Completion",
    "EngineStats",
    "Finished",
    "GenerationEngine",
    "RequestHandle",
    "SamplingParams",
    "TokenStep",
    "sample_tokens",
]

logger = logging.getLogger(__name__)


@dataclass
class _Row:
    handle: RequestHandle
    choice: int
    params: SamplingParams
    max_tokens: int
    generator: torch.Generator | None
    version: int
    adapter: str | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] | None = None
    text: str = ""
    emitted: int = 0
    prefix_offset: int = 0
    read_offset: int = 0
    finish_reason: str | None = None
    stop_reason: str | int | None = None


_PromptKey = tuple[str | None, tuple[int, ...]]
"""A prompt as the prompt cache knows it: (adapter, token ids); the KV rows depend on both."""


def _prompt_key(handle: RequestHandle) -> _PromptKey:
    return handle.adapter, tuple(handle.prompt_ids)


@dataclass
class _PromptKV:
    """One prompt's KV rows (per layer ``[1, heads, len, dim]``) and last-position logits."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    logits: torch.Tensor
    nbytes: int

    @classmethod
    def from_rows(cls, keys: list[torch.Tensor], values: list[torch.Tensor], logits: torch.Tensor) -> _PromptKV:
        size = sum(t.numel() * t.element_size() for t in (*keys, *values)) + logits.numel() * logits.element_size()
        return cls(keys, values, logits, size)

    def owned(self) -> _PromptKV:
        """A copy that does not keep the whole prefill batch's tensors alive."""
        return _PromptKV(
            [k.clone() for k in self.keys], [v.clone() for v in self.values], self.logits.clone(), self.nbytes
        )


class GenerationEngine:
    """Continuous-batching sampler over a :class:`~agentbolt_torch.policy.Policy` (see the module doc).

    Args:
        policy: the shared policy (model, tokenizer, version, lock).
        max_batch_size: most sequences generated together; further requests queue.
        batch_window_s: when idle, how long to wait after the first request for others to
            arrive before starting (0 starts at once).
        max_prefill_tokens: padded-token budget of one prefill forward pass.
        default_max_tokens: ``max_tokens`` of requests that do not set it.
        logprobs_mode: ``"raw"`` (default) or ``"processed"``; see the module doc.
        seed: seed of the sampler used by requests without their own ``seed``.
        cast_weights: cache the autocast-dtype copies of the linear weights per policy version
            (see the module doc); ``False`` lets autocast cast them on every forward pass.
        prompt_cache_mb: memory for the KV rows and logits of recent prompts (see the module
            doc); 0 keeps nothing between prefills (identical prompts admitted together are
            still run once).
    """

    def __init__(
        self,
        policy: Policy,
        *,
        max_batch_size: int = 32,
        batch_window_s: float = 0.02,
        max_prefill_tokens: int = 8192,
        default_max_tokens: int = 512,
        logprobs_mode: LogprobsMode = "raw",
        seed: int | None = 0,
        cast_weights: bool = True,
        prompt_cache_mb: float = 256.0,
    ) -> None:
        import torch

        if prompt_cache_mb < 0:
            raise UserError(f"prompt_cache_mb must be >= 0, got {prompt_cache_mb}")
        if logprobs_mode not in ("raw", "processed"):
            raise UserError(f"logprobs_mode must be 'raw' or 'processed', got {logprobs_mode!r}")
        self.policy = policy
        self.max_batch_size = max_batch_size
        self.batch_window_s = batch_window_s
        self.max_prefill_tokens = max_prefill_tokens
        self.default_max_tokens = default_max_tokens
        self.logprobs_mode: LogprobsMode = logprobs_mode
        self._rng = random.Random(seed)
        self._generator = torch.Generator(device=policy.device)
        self._generator.manual_seed(self._rng.getrandbits(63))
        self._eos = set(policy.eos_token_ids)
        self._cv = threading.Condition()
        self._queue: collections.deque[RequestHandle] = collections.deque()
        self._cancelled: set[RequestHandle] = set()
        self._rows: list[_Row] = []
        self._cache: Any = None
        self._mask: torch.Tensor | None = None
        self._next: torch.Tensor | None = None
        self._admit_paused = False
        self._frozen = False
        self._parked = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._stats = EngineStats()
        self._weights: Policy | ServingWeights = policy
        low_precision = policy.autocast_dtype in (torch.bfloat16, torch.float16)
        self._cast_weights = cast_weights and low_precision
        self._cast: dict[str, torch.Tensor] | None = None
        self._cast_key: tuple[int, int] | None = None
        self.prompt_cache_bytes = int(prompt_cache_mb * 2**20)
        self._prompts: collections.OrderedDict[_PromptKey, _PromptKV] = collections.OrderedDict()
        self._prompts_bytes = 0
        self._prompts_key: tuple[int, int] | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> GenerationEngine:
        """Start the engine thread (idempotent)."""
        if self._thread is None or not self._thread.is_alive():
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name="agentbolt-generation", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop the engine; unfinished requests end with ``finish_reason="abort"``."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        for handle in list(self._queue):
            self._abort_handle(handle)
        self._queue.clear()
        self._cast = None

    def __enter__(self) -> GenerationEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def stats(self) -> EngineStats:
        """A snapshot of the engine's counters."""
        return replace(self._stats)

    def reset_stats(self) -> None:
        """Zero the counters."""
        self._stats = EngineStats()

    @property
    def num_active(self) -> int:
        """Sequences generating now."""
        return len(self._rows)

    @property
    def num_queued(self) -> int:
        """Requests waiting for admission."""
        return len(self._queue)

    def state(self) -> dict[str, Any]:
        """A snapshot of the scheduler for monitoring (plain values, JSON-serialisable; safe from
        any thread): ``queued`` requests (``queued_sequences`` counting ``n``) and the oldest
        one's wait ``oldest_queued_s``; ``active_rows`` generating now, of ``active_requests``,
        and the oldest row's ``oldest_active_s`` since admission and ``oldest_active_tokens``;
        ``paused`` (admission stopped), ``frozen`` (decoding suspended by an in-place pause),
        ``parked`` (the engine thread is waiting for work), ``cancelled`` (cancellations not yet
        handled), ``running`` (the engine thread is alive), ``served_version`` and ``decode_steps``."""
        with self._cv:
            now = time.monotonic()
            queue, rows = list(self._queue), list(self._rows)
            oldest = rows[0] if rows else None  # rows keep their admission order
            return {
                "queued": len(queue),
                "queued_sequences": sum(h.n for h in queue),
                "oldest_queued_s": round(now - queue[0].submitted_at, 3) if queue else None,
                "active_rows": len(rows),
                "active_requests": len({id(row.handle) for row in rows}),
                "oldest_active_s": round(now - (oldest.handle.admitted_at or now), 3) if oldest else None,
                "oldest_active_tokens": len(oldest.token_ids) if oldest else None,
                "paused": self._admit_paused,
                "frozen": self._frozen,
                "parked": self._parked,
                "cancelled": len(self._cancelled),
                "running": self._thread is not None and self._thread.is_alive(),
                "served_version": self._weights.version,
                "decode_steps": self._stats.decode_steps,
            }

    # -- submission ----------------------------------------------------------------------------

    def submit(
        self, prompt_ids: Sequence[int], params: SamplingParams | None = None, n: int = 1, *, adapter: str | None = None
    ) -> RequestHandle:
        """Queue a request for ``n`` samples of ``prompt_ids``; returns at once.

        ``adapter``: with a policy of several adapters (policies by role), the one that generates
        (:data:`~agentbolt_torch.adapters.BASE` or ``None``: the base model alone).

        Raises:
            UserError: empty prompt, a prompt that fills the context, a bad ``n``, or an unknown adapter.
        """
        params = params or SamplingParams()
        if not prompt_ids:
            raise UserError("the prompt is empty")
        if n < 1 or n > 128:
            raise UserError(f"n must be between 1 and 128, got {n}")
        limit = self.policy.max_model_len
        if len(prompt_ids) >= limit:
            raise UserError(
                f"the prompt has {len(prompt_ids)} tokens; the model's context length is {limit}, "
                "which leaves no room to generate"
            )
        vocab = self.policy.base_model.config.vocab_size
        bad = [t for t in prompt_ids if not 0 <= int(t) < vocab]
        if bad:
            raise UserError(f"prompt token ids out of range [0, {vocab}): {bad[:5]}")
        if self._thread is None:
            raise UserError("the generation engine is not started; call start() first")
        handle = RequestHandle(prompt_ids, params, n, self._cancel, adapter=self._adapter_of(adapter))
        with self._cv:
            self._queue.append(handle)
            self._cv.notify_all()
        return handle

    def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        n: int = 1,
        timeout: float | None = None,
        *,
        adapter: str | None = None,
    ) -> list[Completion]:
        """Submit and wait (blocking; for use from threads, not from an event loop)."""
        return self.submit(prompt_ids, params, n, adapter=adapter).wait(timeout)

    # -- adapters (policies by role) -----------------------------------------------------------

    def _adapter_of(self, adapter: str | None) -> str | None:
        """The adapter a request runs with: ``None`` for a single policy, else a name of the
        policy's adapters or BASE (also for ``None``)."""
        names = self.policy.adapters
        if not names:
            if adapter not in (None, BASE):
                raise UserError(f"the policy has no adapters (asked for {adapter!r})")
            return None
        if adapter is None:
            return BASE
        check_names([adapter], names)
        return adapter

    def _adapter_kwargs(self, adapters: Sequence[str | None]) -> dict[str, Any]:
        """Forward-pass keywords that run each row with its own adapter (peft's mixed batches;
        nothing for a single policy)."""
        return {"adapter_names": list(adapters)} if self.policy.adapters else {}

    def _cancel(self, handle: RequestHandle) -> None:
        with self._cv:
            if not handle.done:
                self._cancelled.add(handle)
                self._cv.notify_all()

    # -- pause / resume ------------------------------------------------------------------------

    def pause(self, *, drain: bool = True, timeout: float | None = None) -> None:
        """Stop admitting new requests (they wait in the queue) and wait until generation is idle.

        With ``drain=True`` in-flight requests finish first; with ``drain=False`` they are
        suspended between two decode steps and continue after :meth:`resume` (their later tokens
        then come from the updated weights).

        Raises:
            TimeoutError: generation did not become idle within ``timeout`` seconds (the engine
                stays paused; call :meth:`resume`).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            self._admit_paused = True
            if not drain:
                self._frozen = True
            self._cv.notify_all()
            while self._thread is not None and not (self._parked and (not drain or not self._rows)):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"generation still busy after {timeout} s ({len(self._rows)} sequences)")
                self._cv.wait(remaining)
            if drain and self.serving_copy is None:
                self._release_weight_caches()

    def _release_weight_caches(self) -> None:
        """Drop what depends on the current weights (the autocast-dtype copies, the prompt cache):
        a drained pause over the policy's own weights is where they change (an update), so the
        memory goes to the update instead of sitting idle; generation rebuilds both after it."""
        self._cast = None
        self._cast_key = None
        self._prompts.clear()
        self._prompts_bytes = 0
        self._prompts_key = None

    def resume(self) -> None:
        """Admit requests again after :meth:`pause`."""
        with self._cv:
            self._admit_paused = False
            self._frozen = False
            self._cv.notify_all()

    # -- serving a copy of the weights (asynchronous training; see agentbolt_torch.generation.serving_copy) -----

    @property
    def served_version(self) -> int:
        """The policy version of the weights generation uses now (the policy's own, unless
        :meth:`serve_copy` is on and the policy trained since the last swap)."""
        return self._weights.version

    def served_version_of(self, adapter: str | None) -> int:
        """:attr:`served_version` for ``adapter`` (policies by role: the adapter's own version)."""
        return self._weights.version_of(adapter)

    @property
    def serving_copy(self) -> ServingWeights | None:
        """The copy generation reads (:meth:`serve_copy`), or ``None`` when it reads the policy."""
        return self._weights if isinstance(self._weights, ServingWeights) else None

    def serve_copy(self) -> ServingWeights:
        """Generate from a copy of the policy's trainable weights from now on, so that the policy
        can be trained while generation runs (idempotent; see :mod:`agentbolt_torch.generation.serving_copy`).
        :meth:`swap_weights` brings the copy up to date."""
        current = self.serving_copy
        if current is not None:
            return current
        weights = ServingWeights(self.policy)
        with self._cv:
            self._weights = weights
        return weights

    def swap_weights(self, *, drain: bool = True, timeout: float | None = None) -> SwapResult:
        """Serve the policy's current weights and version: copy them into the serving copy while
        generation is stopped, with the calls in flight finished first (``drain=True``) or
        carried on with the new weights (``drain=False``, in place). Requests arriving meanwhile
        wait in the queue. Thread-safe; returns the timings.

        Raises:
            UserError: :meth:`serve_copy` was not called (generation reads the policy itself).
            TimeoutError: draining took longer than ``timeout`` (nothing was swapped).
        """
        weights = self.serving_copy
        if weights is None:
            raise UserError("swap_weights() needs serve_copy() first: generation reads the policy's own weights")
        started = time.perf_counter()
        previous = weights.version
        try:
            self.pause(drain=drain, timeout=timeout)
            stopped = time.perf_counter()
            carried = len(self._rows)
            weights.load_from(self.policy)
        finally:
            self.resume()
        done = time.perf_counter()
        return SwapResult(
            version=weights.version,
            previous_version=previous,
            drain=drain,
            wait_s=stopped - started,
            copy_s=done - stopped,
            carried_rows=carried,
        )

    @property
    def is_paused(self) -> bool:
        """True between :meth:`pause` and :meth:`resume`."""
        return self._admit_paused

    @contextlib.contextmanager
    def paused(self, *, drain: bool = True, timeout: float | None = None) -> Iterator[None]:
        """``with engine.paused(): updater.update(...)`` — no generation runs inside the block."""
        self.pause(drain=drain, timeout=timeout)
        try:
            yield
        finally:
            self.resume()

    # -- the engine thread ---------------------------------------------------------------------

    def _run(self) -> None:
        import torch

        with torch.inference_mode():
            while True:
                with self._cv:
                    new = self._wait_for_work()
                    if new is None:
                        break
                try:
                    if new:
                        self._prefill(new)
                    if self._rows:
                        self._decode_step()
                except Exception as exc:  # a failed forward pass fails the requests it served
                    logger.exception("generation failed; failing %d in-flight sequences", len(self._rows))
                    handles = {row.handle for row in self._rows} | set(new or ())
                    with self._cv:
                        self._reset_batch()
                    for handle in handles:
                        if not handle.done:
                            handle._fail(exc)
        with self._cv:
            for handle in {row.handle for row in self._rows}:
                self._abort_handle(handle)
            self._reset_batch()
            self._prompts.clear()
            self._prompts_bytes = 0
            self._prompts_key = None
            self._parked = True
            self._cv.notify_all()

    def _wait_for_work(self) -> list[RequestHandle] | None:
        """Under ``self._cv``: block until there is something to do; returns requests to admit."""
        while True:
            self._handle_cancellations()
            if self._stopping:
                return None
            can_admit = not self._admit_paused and bool(self._queue)
            can_step = bool(self._rows) and not self._frozen
            if can_admit or can_step:
                break
            self._parked = True
            self._cv.notify_all()
            self._cv.wait()
        self._parked = False
        if not self._rows and self.batch_window_s > 0 and not self._admit_paused:
            deadline = time.monotonic() + self.batch_window_s
            while not self._stopping and not self._admit_paused and self._queued_sequences() < self.max_batch_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cv.wait(remaining)
            self._handle_cancellations()
        if self._admit_paused:
            return []
        admitted: list[RequestHandle] = []
        active = len(self._rows)
        while self._queue:
            handle = self._queue[0]
            if active > 0 and active + handle.n > self.max_batch_size:
                break
            admitted.append(self._queue.popleft())
            active += handle.n
        return admitted

    def _queued_sequences(self) -> int:
        return sum(h.n for h in self._queue)

    def _handle_cancellations(self) -> None:
        if not self._cancelled:
            return
        cancelled, self._cancelled = self._cancelled, set()
        for handle in cancelled:
            if handle in self._queue:
                self._queue.remove(handle)
                self._abort_handle(handle)
        keep = []
        for i, row in enumerate(self._rows):
            if row.handle in cancelled:
                row.finish_reason = "abort"
                self._finish_row(row)
            else:
                keep.append(i)
        if len(keep) < len(self._rows):
            self._select_rows(keep)

    def _abort_handle(self, handle: RequestHandle) -> None:
        if handle.policy_version is None:
            handle._admit(self._weights.version_of(handle.adapter))
        for choice in range(handle.n):
            if handle.outputs[choice] is None:
                output = Completion(choice, [], [], None, "", "abort", None, handle.policy_version or 0)
                handle._emit(Finished(choice, output, ""))

    # -- batch state ---------------------------------------------------------------------------

    def _reset_batch(self) -> None:
        self._rows = []
        self._cache = None
        self._mask = None
        self._next = None

    def _select_rows(self, keep: list[int]) -> None:
        import torch

        self._rows = [self._rows[i] for i in keep]
        if not keep:
            self._reset_batch()
            return
        index = torch.tensor(keep, device=self.policy.device)
        cache_select(self._cache, index)
        assert self._mask is not None and self._next is not None
        self._mask = self._mask.index_select(0, index)
        self._next = self._next.index_select(0, index)
        # Drop leading columns that are padding for every remaining row.
        used = self._mask.any(dim=0)
        start = int(used.to(torch.int8).argmax())
        if start > 0:
            cache_trim_left(self._cache, start)
            self._mask = self._mask[:, start:]

    def _merge(self, cache: Any, mask: torch.Tensor, next_tokens: torch.Tensor, rows: list[_Row]) -> None:
        import torch

        if not self._rows:
            self._cache, self._mask, self._next, self._rows = cache, mask, next_tokens, rows
            return
        assert self._mask is not None and self._next is not None
        length = max(self._mask.shape[1], mask.shape[1])
        self._cache = cache_concat(self._cache, cache, length)
        self._mask = torch.cat([pad_left(self._mask, length), pad_left(mask, length)], dim=0)
        self._next = torch.cat([self._next, next_tokens])
        self._rows = self._rows + rows

    # -- forward passes ------------------------------------------------------------------------

    def _forward(self, **kwargs: Any) -> Any:
        """One forward pass of the policy (call with the policy lock held, inside autocast)."""
        policy, weights = self.policy, self._weights
        if not self._cast_weights:
            return weights.model(**kwargs)
        import torch
        from torch.func import functional_call

        key = (weights.weights_generation, weights.version)
        if self._cast is None or self._cast_key != key:
            self._cast = None  # free the old copies first
            dtype = policy.autocast_dtype
            cast: dict[str, torch.Tensor] = {}
            for name, module in weights.model.named_modules():
                if isinstance(module, torch.nn.Linear):
                    cast[f"{name}.weight"] = module.weight.detach().to(dtype)
                    if module.bias is not None:
                        cast[f"{name}.bias"] = module.bias.detach().to(dtype)
            self._cast, self._cast_key = cast, key
        return functional_call(weights.model, self._cast, args=(), kwargs=kwargs, tie_weights=False, strict=False)

    def _prefill(self, handles: list[RequestHandle]) -> None:
        """Admit ``handles``: their prompts' KV rows (computed once per distinct prompt, or from the
        prompt cache), their first tokens sampled, their rows merged into the running batch."""
        import torch

        from .._kv_caches import AutocastDtypeCache

        t0 = time.perf_counter()
        device = self.policy.device
        stats = self._stats
        with self._weights.lock:
            versions = {h.adapter: self._weights.version_of(h.adapter) for h in handles}
            self._sync_prompt_cache()
            prompts: dict[_PromptKey, _PromptKV | None] = {}
            for handle in handles:
                key = _prompt_key(handle)
                if key in prompts:
                    stats.prompt_cache_hits += 1
                    stats.cached_prompt_tokens += len(key[1])
                    continue
                cached = self._prompts.get(key)
                if cached is not None:
                    self._prompts.move_to_end(key)
                    stats.prompt_cache_hits += 1
                    stats.cached_prompt_tokens += len(key[1])
                prompts[key] = cached
            missing = [key for key, entry in prompts.items() if entry is None]
            for chunk in self._prefill_chunks(missing):
                for key, entry in zip(chunk, self._run_prompts(chunk), strict=True):
                    prompts[key] = entry
                    self._remember_prompt(key, entry)
            order = list(prompts)
            entries = [entry for entry in prompts.values() if entry is not None]
            assert len(entries) == len(order), "every prompt is cached or prefilled above"
            length = max(len(key[1]) for key in order)
            cache = AutocastDtypeCache(config=self.policy.base_model.config)
            for layer in range(len(entries[0].keys)):
                cache.update(
                    torch.cat([pad_seq_left(e.keys[layer], length) for e in entries]),
                    torch.cat([pad_seq_left(e.values[layer], length) for e in entries]),
                    layer,
                )
            mask = torch.zeros((len(order), length), dtype=torch.long, device=device)
            for i, key in enumerate(order):
                mask[i, length - len(key[1]) :] = 1
            logits = torch.stack([e.logits for e in entries])
        position = {key: i for i, key in enumerate(order)}
        repeat = [position[_prompt_key(h)] for h in handles for _ in range(h.n)]
        if repeat != list(range(len(order))):
            index = torch.tensor(repeat, device=device)
            cache_select(cache, index)
            mask = mask.index_select(0, index)
            logits = logits.index_select(0, index)
        rows: list[_Row] = []
        for handle in handles:
            version = versions[handle.adapter]
            handle._admit(version)
            prompt_room = self.policy.max_model_len - len(handle.prompt_ids)
            max_tokens = min(handle.params.max_tokens or self.default_max_tokens, prompt_room)
            for choice in range(handle.n):
                rows.append(
                    _Row(
                        handle=handle,
                        choice=choice,
                        params=handle.params,
                        max_tokens=max_tokens,
                        generator=self._row_generator(handle.params.seed, choice),
                        version=version,
                        adapter=handle.adapter,
                    )
                )
        stats.requests += len(handles)
        stats.sequences += len(rows)
        stats.max_prefill_requests = max(stats.max_prefill_requests, len(handles))
        stats.max_batch_requests = max(stats.max_batch_requests, len(handles))
        tokens = self._sample_and_record(logits, rows)
        keep = [i for i, row in enumerate(rows) if row.finish_reason is None]
        if keep:
            index = torch.tensor(keep, device=device)
            if len(keep) != len(rows):
                cache_select(cache, index)
                mask = mask.index_select(0, index)
            self._merge(cache, mask, tokens.index_select(0, index), [rows[i] for i in keep])
        stats.busy_s += time.perf_counter() - t0

    def _prefill_chunks(self, prompts: list[_PromptKey]) -> list[list[_PromptKey]]:
        """Split prompts into forward passes of at most ``max_prefill_tokens`` padded tokens
        (a longer prompt gets a pass of its own)."""
        chunks: list[list[_PromptKey]] = []
        for prompt in prompts:
            chunk = chunks[-1] if chunks else []
            longest = max([len(p[1]) for p in chunk] + [len(prompt[1])])
            if not chunk or longest * (len(chunk) + 1) > self.max_prefill_tokens:
                chunks.append([prompt])
            else:
                chunk.append(prompt)
        return chunks

    def _run_prompts(self, keys: list[_PromptKey]) -> list[_PromptKV]:
        """One forward pass over left-padded prompts (each with its adapter): each prompt's KV
        rows and last logits."""
        import torch

        from .._kv_caches import AutocastDtypeCache

        device = self.policy.device
        pad = self.policy.tokenizer.pad_token_id or 0
        prompts = [prompt for _, prompt in keys]
        length = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), length), pad, dtype=torch.long, device=device)
        mask = torch.zeros((len(prompts), length), dtype=torch.long, device=device)
        for i, prompt in enumerate(prompts):
            ids[i, length - len(prompt) :] = torch.tensor(prompt, device=device)
            mask[i, length - len(prompt) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = AutocastDtypeCache(config=self.policy.base_model.config)
        with self.policy.autocast():
            out = self._forward(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
                **self._adapter_kwargs([adapter for adapter, _ in keys]),
            )
        logits = out.logits[:, -1, :].float()
        layers = cache_layers(cache)
        stats = self._stats
        stats.prefill_batches += 1
        stats.prompt_tokens += sum(len(p) for p in prompts)
        return [
            _PromptKV.from_rows(
                [layer.keys[i : i + 1, :, length - len(p) :] for layer in layers],
                [layer.values[i : i + 1, :, length - len(p) :] for layer in layers],
                logits[i],
            )
            for i, p in enumerate(prompts)
        ]

    # -- prompt cache ----------------------------------------------------------------------------

    def _sync_prompt_cache(self) -> None:
        """Empty the prompt cache when the weights or the version changed (call under the lock)."""
        key = (self._weights.weights_generation, self._weights.version)
        if self._prompts_key != key:
            self._prompts.clear()
            self._prompts_bytes = 0
            self._prompts_key = key

    def _remember_prompt(self, key: _PromptKey, entry: _PromptKV) -> None:
        if entry.nbytes > self.prompt_cache_bytes:
            return
        while self._prompts and self._prompts_bytes + entry.nbytes > self.prompt_cache_bytes:
            _, old = self._prompts.popitem(last=False)
            self._prompts_bytes -= old.nbytes
        self._prompts[key] = entry.owned()
        self._prompts_bytes += entry.nbytes

    def _decode_step(self) -> None:
        import torch

        t0 = time.perf_counter()
        assert self._mask is not None and self._next is not None
        batch = len(self._rows)
        positions = self._mask.sum(dim=-1, keepdim=True)
        mask = torch.cat([self._mask, self._mask.new_ones((batch, 1))], dim=1)
        with self._weights.lock, self.policy.autocast():
            out = self._forward(
                input_ids=self._next[:, None],
                attention_mask=mask,
                position_ids=positions,
                past_key_values=self._cache,
                use_cache=True,
                **self._adapter_kwargs([row.adapter for row in self._rows]),
            )
        self._mask = mask
        logits = out.logits[:, -1, :].float()
        stats = self._stats
        stats.decode_steps += 1
        stats.max_batch_rows = max(stats.max_batch_rows, batch)
        stats.max_batch_requests = max(stats.max_batch_requests, len({id(r.handle) for r in self._rows}))
        self._next = self._sample_and_record(logits, self._rows)
        keep = [i for i, row in enumerate(self._rows) if row.finish_reason is None]
        if len(keep) < batch:
            with self._cv:
                self._select_rows(keep)
        stats.busy_s += time.perf_counter() - t0

    # -- sampling ------------------------------------------------------------------------------

    def _row_generator(self, seed: int | None, choice: int) -> torch.Generator | None:
        import torch

        if seed is None:
            return None
        generator = torch.Generator(device=self.policy.device)
        generator.manual_seed((int(seed) * 1_000_003 + choice) % (2**63))
        return generator

    def _sample_and_record(self, logits: torch.Tensor, rows: list[_Row]) -> torch.Tensor:
        """Sample one token per row from ``logits`` [rows, vocab], record it, check stops."""
        tokens, logprobs, top = sample_tokens(
            logits, [row.params for row in rows], [row.generator for row in rows], self._generator, self.logprobs_mode
        )
        token_list = tokens.tolist()
        logprob_list = logprobs.tolist()
        self._stats.generated_tokens += len(rows)
        for i, row in enumerate(rows):
            self._record(row, token_list[i], logprob_list[i], top[i] if top is not None else None)
        return tokens

    def _record(self, row: _Row, token: int, logprob: float, top: list[tuple[int, float]] | None) -> None:
        params = row.params
        row.token_ids.append(token)
        row.logprobs.append(logprob)
        if params.top_logprobs > 0:
            if row.top is None:
                row.top = []
            row.top.append(top or [])
        old_len = len(row.text)
        row.text += self._detokenize(row)
        if not params.ignore_eos and token in self._eos:
            row.finish_reason = "stop"
        elif token in params.stop_token_ids:
            row.finish_reason, row.stop_reason = "stop", token
        if params.stop:
            hit = find_stop(row.text, params.stop, old_len)
            if hit is not None:
                pos, stop = hit
                row.text = row.text[: pos + (len(stop) if params.include_stop_str_in_output else 0)]
                row.finish_reason, row.stop_reason = "stop", stop
        if row.finish_reason is None and len(row.token_ids) >= row.max_tokens:
            row.finish_reason = "length"
        if row.finish_reason is not None:
            self._finish_row(row, last=(token, logprob, top))
            return
        safe = len(row.text) - held_back(row.text, params.stop)
        delta = row.text[row.emitted : safe] if safe > row.emitted else ""
        row.emitted = max(row.emitted, safe)
        row.handle._emit(TokenStep(row.choice, token, logprob, top if params.top_logprobs else None, delta))

    def _finish_row(self, row: _Row, last: tuple[int, float, Any] | None = None) -> None:
        if row.finish_reason != "stop" or row.stop_reason is None or isinstance(row.stop_reason, int):
            # flush a trailing incomplete character (a stop-string cut already fixed the text)
            row.text += self._flush_detokenizer(row)
        output = Completion(
            index=row.choice,
            token_ids=list(row.token_ids),
            logprobs=list(row.logprobs),
            top_logprobs=[list(t) for t in row.top] if row.top is not None else None,
            text=row.text,
            finish_reason=row.finish_reason or "abort",
            stop_reason=row.stop_reason,
            policy_version=row.version,
        )
        tail = row.text[row.emitted :]
        row.emitted = len(row.text)
        if last is not None:
            token, logprob, top = last
            row.handle._emit(TokenStep(row.choice, token, logprob, top if row.params.top_logprobs else None, tail))
            tail = ""
        row.handle._emit(Finished(row.choice, output, tail))

    # -- incremental detokenization (vLLM's prefix/read offsets) -------------------------------

    def _detokenize(self, row: _Row) -> str:
        tok = self.policy.tokenizer
        skip = row.params.skip_special_tokens
        ids = row.token_ids
        prefix = decode_text(tok, ids[row.prefix_offset : row.read_offset], skip_special_tokens=skip)
        full = decode_text(tok, ids[row.prefix_offset :], skip_special_tokens=skip)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            row.prefix_offset, row.read_offset = row.read_offset, len(ids)
            return full[len(prefix) :]
        return ""

    def _flush_detokenizer(self, row: _Row) -> str:
        if row.read_offset >= len(row.token_ids):
            return ""
        tok = self.policy.tokenizer
        skip = row.params.skip_special_tokens
        prefix = decode_text(tok, row.token_ids[row.prefix_offset : row.read_offset], skip_special_tokens=skip)
        full = decode_text(tok, row.token_ids[row.prefix_offset :], skip_special_tokens=skip)
        row.read_offset = len(row.token_ids)
        return full[len(prefix) :]
