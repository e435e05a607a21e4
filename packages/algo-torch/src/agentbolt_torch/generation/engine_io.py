"""What goes in and out of the :class:`~agentbolt_torch.generation.engine.GenerationEngine`: sampling
parameters, per-token steps, completions, the handle of a submitted request, the engine's counters."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from agentbolt.errors import UserError

__all__ = ["Completion", "EngineStats", "Finished", "LogprobsMode", "RequestHandle", "SamplingParams", "TokenStep"]

LogprobsMode = Literal["raw", "processed"]


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings (one request may ask for ``n`` samples of one prompt)."""

    max_tokens: int | None = None
    """Most tokens to generate; ``None`` means the engine's ``default_max_tokens``. Always capped
    by the context length."""
    temperature: float = 1.0
    """0 means greedy decoding."""
    top_p: float = 1.0
    """Nucleus sampling mass, in (0, 1]."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 or -1 disables."""
    stop: tuple[str, ...] = ()
    """Stop strings: generation ends when the text contains one; the text is cut before it."""
    stop_token_ids: tuple[int, ...] = ()
    """Extra token ids that end generation (the token is kept in ``token_ids``)."""
    ignore_eos: bool = False
    """Keep generating past the eos token (benchmarks)."""
    seed: int | None = None
    """Seed of this request's sampler: the same seed and prompt give the same tokens."""
    top_logprobs: int = 0
    """How many most likely alternatives to return per token (0: only the sampled token's)."""
    include_stop_str_in_output: bool = False
    """Keep the matched stop string at the end of the text."""
    skip_special_tokens: bool = True
    """Leave special tokens (eos, ``<|im_end|>``) out of the text (they stay in ``token_ids``)."""

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise UserError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise UserError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise UserError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_logprobs < 0 or self.top_logprobs > 20:
            raise UserError(f"top_logprobs must be between 0 and 20, got {self.top_logprobs}")
        if any(not s for s in self.stop):
            raise UserError("stop strings must not be empty")

    @property
    def greedy(self) -> bool:
        """True for temperature 0."""
        return self.temperature <= 1e-5


@dataclass
class TokenStep:
    """One generated token of one choice (streamed as it is sampled)."""

    choice: int
    """Choice index within the request (0..n-1)."""
    token_id: int
    """The sampled token."""
    logprob: float
    """Its logprob (see the module's logprob convention)."""
    top_logprobs: list[tuple[int, float]] | None
    """The most likely alternatives ``(token_id, logprob)``, when requested."""
    text: str
    """Text that became final with this token (may be empty: an incomplete UTF-8 character or
    a possible stop-string prefix is held back)."""


@dataclass
class Completion:
    """The final output of one choice."""

    index: int
    """Choice index within the request."""
    token_ids: list[int]
    """Every generated token id, including a final eos or stop token."""
    logprobs: list[float]
    """One logprob per entry of ``token_ids``."""
    top_logprobs: list[list[tuple[int, float]]] | None
    """Per token, the requested most likely alternatives; ``None`` when not requested."""
    text: str
    """Decoded text (special tokens skipped, cut before a matched stop string)."""
    finish_reason: str
    """``stop`` (eos, stop string or stop token), ``length`` or ``abort`` (cancelled/failed)."""
    stop_reason: str | int | None
    """The matched stop string or stop token id; ``None`` for eos and other reasons."""
    policy_version: int
    """Policy version when the choice was admitted."""


@dataclass
class Finished:
    """A choice finished; ``text`` is the final piece of text not streamed before."""

    choice: int
    output: Completion
    text: str


class RequestHandle:
    """A submitted request: await its events or result from asyncio, or wait from a thread."""

    _ids = itertools.count(1)

    def __init__(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        n: int,
        cancel: Callable[[RequestHandle], None],
        adapter: str | None = None,
    ) -> None:
        self.request_id = next(self._ids)
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self.n = n
        self.adapter = adapter
        """The adapter (policy by role) that generates it; ``None`` for a single policy."""
        self.policy_version: int | None = None
        """Policy version at admission (set when the request starts generating): the adapter's own
        version when ``adapter`` is set."""
        self.outputs: list[Completion | None] = [None] * n
        self.error: BaseException | None = None
        self.submitted_at = time.monotonic()
        self.admitted_at: float | None = None
        self._cancel = cancel
        """Asks the engine that runs it to stop it (its scheduler owns the running rows)."""
        self._lock = threading.Lock()
        self._pending: collections.deque[TokenStep | Finished] = collections.deque()
        self._finished = 0
        self._done = threading.Event()
        self._admitted = threading.Event()
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self._async_wakeup = asyncio.Event() if self._loop is not None else None

    # -- engine side ---------------------------------------------------------------------------

    def _notify(self) -> None:
        if self._loop is not None and self._async_wakeup is not None:
            with contextlib.suppress(RuntimeError):  # loop closed: nobody is listening
                self._loop.call_soon_threadsafe(self._async_wakeup.set)

    def _admit(self, version: int) -> None:
        self.policy_version = version
        self.admitted_at = time.monotonic()
        self._admitted.set()
        self._notify()

    def _emit(self, event: TokenStep | Finished) -> None:
        with self._lock:
            self._pending.append(event)
            if isinstance(event, Finished):
                self.outputs[event.choice] = event.output
                self._finished += 1
                if self._finished == self.n:
                    self._done.set()
        self._notify()

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            self.error = exc
            self._done.set()
            self._admitted.set()
        self._notify()

    # -- consumer side ---------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """True once every choice finished (or the request failed)."""
        return self._done.is_set()

    def cancel(self) -> None:
        """Stop generating; unfinished choices end with ``finish_reason="abort"``."""
        self._cancel(self)

    async def admitted(self) -> int:
        """Wait until the request starts generating; returns its policy version."""
        while not self._admitted.is_set():
            await self._wait_async()
        if self.error is not None:
            raise self.error
        assert self.policy_version is not None
        return self.policy_version

    async def _wait_async(self) -> None:
        assert self._async_wakeup is not None, "the request was submitted outside an event loop"
        await self._async_wakeup.wait()
        self._async_wakeup.clear()

    async def events(self) -> AsyncIterator[TokenStep | Finished]:
        """Yield token steps and finish events until every choice is done."""
        seen_finished = 0
        while True:
            with self._lock:
                batch = list(self._pending)
                self._pending.clear()
                error = self.error
            for event in batch:
                yield event
                if isinstance(event, Finished):
                    seen_finished += 1
            if seen_finished == self.n:
                return
            if error is not None:
                raise error
            if not batch:
                await self._wait_async()

    async def result(self) -> list[Completion]:
        """Wait for every choice and return them in order."""
        async for _ in self.events():
            pass
        return self._collect()

    def wait(self, timeout: float | None = None) -> list[Completion]:
        """Block the calling thread until done (the sync counterpart of :meth:`result`)."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.request_id} not finished after {timeout} s")
        return self._collect()

    def _collect(self) -> list[Completion]:
        if self.error is not None:
            raise self.error
        return [o for o in self.outputs if o is not None]


@dataclass
class EngineStats:
    """Counters of the engine (a snapshot; see :attr:`GenerationEngine.stats`)."""

    requests: int = 0
    """Requests admitted."""
    sequences: int = 0
    """Choices admitted (a request with ``n=4`` counts 4)."""
    prefill_batches: int = 0
    """Prefill forward passes."""
    decode_steps: int = 0
    """Decode forward passes."""
    prompt_tokens: int = 0
    """Prompt tokens run through the model (each distinct prompt once; cached prompts count 0)."""
    cached_prompt_tokens: int = 0
    """Prompt tokens of requests served from the prompt cache (or by an identical prompt prefilled
    in the same batch) instead of a forward pass."""
    prompt_cache_hits: int = 0
    """Requests whose prompt needed no forward pass of its own."""
    generated_tokens: int = 0
    """Tokens sampled."""
    max_batch_rows: int = 0
    """Most sequences in one decode step."""
    max_batch_requests: int = 0
    """Most distinct requests in one forward pass (prefill or decode): > 1 means requests were batched."""
    max_prefill_requests: int = 0
    """Most distinct requests prefilled together."""
    busy_s: float = 0.0
    """Seconds spent in forward passes and sampling."""

    def as_dict(self) -> dict[str, float]:
        """The counters as a dict."""
        return dict(self.__dict__)
