"""An LLM judge over any OpenAI-compatible endpoint: rubric scores and RULER-style rankings.

    judge = LLMJudge("https://api.openai.com/v1", "gpt-4.1-mini", api_key=os.environ["OPENAI_API_KEY"])
    score = await judge.score(Trajectory.of_text("What is 2+2?", "4"))      # JudgeScore | None
    scores = await judge.rank([traj_a, traj_b, traj_c])                      # same task, relative
    judge.usage                                                             # calls, tokens, retries, ...

What makes it safe to put in a training loop:

- **never raises on a bad judge**: an answer that cannot be parsed
  (:class:`~agentbolt.rewards.prompts.MalformedJudgement`) is counted in ``usage.malformed`` and
  asked again (up to ``max_retries``); HTTP errors, timeouts and 429/5xx answers are retried
  with backoff (``usage.retries``); when every try fails the result is ``None`` (no reward: the
  session stays unscored, a training rollout's reward is missing and LightningRL reports it),
  counted in ``usage.failed``;
- **caching**: the same prompt to the same model is answered from the cache (memory, plus an
  optional SQLite file that survives restarts); ``usage.cached`` counts hits;
- **cost**: ``usage.prompt_tokens`` / ``completion_tokens`` add up the endpoint's ``usage``;
- **bounded concurrency** (``max_concurrency`` requests at once).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from ..errors import UserError
from .prompts import DEFAULT_RUBRIC, MalformedJudgement, parse_ranking, parse_rubric, ranking_messages, rubric_messages
from .trajectory import Trajectory

__all__ = ["JudgeCache", "JudgeScore", "JudgeUsage", "LLMJudge"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JudgeScore:
    """A judge's verdict on one trajectory."""

    reward: float
    """In [0, 1]: ``score / 10`` for a rubric, the relative score for a ranking."""
    reason: str = ""
    """The judge's one-sentence reason."""
    kind: str = "rubric"
    """``rubric`` or ``ranking``."""
    cached: bool = False
    """Answered from the cache."""


@dataclass
class JudgeUsage:
    """What a judge has cost and how often it misbehaved (counters only grow)."""

    calls: int = 0
    """HTTP requests sent to the judge endpoint."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: int = 0
    """Judgements answered from the cache (no request)."""
    retries: int = 0
    """Requests repeated after an HTTP error, a timeout or a malformed answer."""
    malformed: int = 0
    """Answers that could not be parsed (each is retried while tries remain)."""
    failed: int = 0
    """Judgements given up after every try (their result is ``None``)."""

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class JudgeCache:
    """Judgements by prompt hash: an LRU in memory, optionally backed by a SQLite file."""

    def __init__(self, path: str | Path | None = None, *, max_entries: int = 100_000) -> None:
        self.max_entries = max_entries
        self._memory: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(path), check_same_thread=False)
            self._db.execute("CREATE TABLE IF NOT EXISTS judgements (key TEXT PRIMARY KEY, answer TEXT NOT NULL)")
            self._db.commit()

    def get(self, key: str) -> str | None:
        with self._lock:
            if key in self._memory:
                self._memory.move_to_end(key)
                return self._memory[key]
            if self._db is None:
                return None
            row = self._db.execute("SELECT answer FROM judgements WHERE key = ?", (key,)).fetchone()
            if row is not None:
                self._put_memory(key, row[0])
            return None if row is None else str(row[0])

    def put(self, key: str, answer: str) -> None:
        with self._lock:
            self._put_memory(key, answer)
            if self._db is not None:
                self._db.execute("INSERT OR REPLACE INTO judgements (key, answer) VALUES (?, ?)", (key, answer))
                self._db.commit()

    def _put_memory(self, key: str, answer: str) -> None:
        self._memory[key] = answer
        self._memory.move_to_end(key)
        while len(self._memory) > self.max_entries:
            self._memory.popitem(last=False)

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


class LLMJudge:
    """Scores trajectories with an LLM behind an OpenAI-compatible ``/chat/completions``.

    Args:
        base_url: the endpoint's base URL, ending in ``/v1``.
        model: the judge model's name.
        api_key: sent as ``Authorization: Bearer``.
        rubric: what counts (:data:`~agentbolt.rewards.prompts.DEFAULT_RUBRIC` by default).
        temperature: sampling temperature of the judge (0: as repeatable as the endpoint allows).
        max_tokens: longest judge answer.
        max_retries: further tries after a failed or malformed answer.
        timeout_s: per request.
        max_concurrency: requests in flight at once.
        cache: a :class:`JudgeCache`, ``True`` (in memory), a path (SQLite file) or ``False``.
        backoff_s: first retry delay (doubles, with jitter).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        rubric: str = DEFAULT_RUBRIC,
        temperature: float = 0.0,
        max_tokens: int = 512,
        max_retries: int = 3,
        timeout_s: float = 120.0,
        max_concurrency: int = 4,
        cache: JudgeCache | bool | str | Path = True,
        backoff_s: float = 0.5,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise UserError(f"the judge's base_url must be an http(s) URL ending in /v1, got {base_url!r}")
        if max_retries < 0 or max_concurrency < 1:
            raise UserError("max_retries must be >= 0 and max_concurrency >= 1")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.rubric = rubric
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.max_retries = max_retries
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.usage = JudgeUsage()
        if cache is True:
            self.cache: JudgeCache | None = JudgeCache()
        elif cache is False:
            self.cache = None
        elif isinstance(cache, JudgeCache):
            self.cache = cache
        else:
            self.cache = JudgeCache(cache)
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._limit = max_concurrency
        self._semaphores: dict[int, asyncio.Semaphore] = {}
        self._rng = random.Random(0)

    def _semaphore(self) -> asyncio.Semaphore:
        loop_id = id(asyncio.get_running_loop())
        if loop_id not in self._semaphores:
            self._semaphores[loop_id] = asyncio.Semaphore(self._limit)
        return self._semaphores[loop_id]

    # -- judgements -------------------------------------------------------------------------------

    async def score(self, trajectory: Trajectory, *, reference: str | None = None) -> JudgeScore | None:
        """An absolute rubric score of one trajectory (``None`` when the judge failed every try)."""
        messages = rubric_messages(trajectory, rubric=self.rubric, reference=reference)
        answer = await self._judge(messages, lambda text: [parse_rubric(text)], "rubric")
        if answer is None:
            return None
        (scored,), cached = answer
        return JudgeScore(scored.reward, scored.reason, "rubric", cached)

    async def rank(self, trajectories: Sequence[Trajectory], *, task: str | None = None) -> list[JudgeScore | None]:
        """Relative scores of trajectories for the same task, in their order (RULER-style).

        One trajectory is scored with the rubric instead (there is nothing to compare it with).
        Every entry is ``None`` when the judge failed every try.
        """
        items = list(trajectories)
        if not items:
            return []
        if len(items) == 1:
            return [await self.score(items[0])]
        messages = ranking_messages(items, rubric=self.rubric, task=task)
        answer = await self._judge(messages, lambda text: parse_ranking(text, len(items)), "ranking")
        if answer is None:
            return [None] * len(items)
        scores, cached = answer
        return [JudgeScore(s.reward, s.reason, "ranking", cached) for s in scores]

    async def aclose(self) -> None:
        """Close the cache file, if any."""
        if self.cache is not None:
            self.cache.close()

    # -- the request loop -------------------------------------------------------------------------

    def _cache_key(self, messages: list[dict[str, str]]) -> str:
        payload = orjson.dumps(
            {"model": self.model, "temperature": self.temperature, "max_tokens": self.max_tokens, "messages": messages}
        )
        return hashlib.sha256(payload).hexdigest()

    async def _judge(self, messages: list[dict[str, str]], parse: Any, kind: str) -> tuple[list[Any], bool] | None:
        key = self._cache_key(messages)
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                try:
                    parsed = parse(hit)
                except MalformedJudgement:
                    parsed = None  # a cache written by an older parser: ask again
                if parsed is not None:
                    self.usage.cached += 1
                    return parsed, True
        delay = self.backoff_s
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.usage.retries += 1
                await asyncio.sleep(delay * (0.5 + self._rng.random()))
                delay *= 2
            text = await self._request(messages)
            if text is None:
                continue
            try:
                parsed = parse(text)
            except MalformedJudgement as exc:
                self.usage.malformed += 1
                log.info("malformed %s judgement (try %d): %s", kind, attempt + 1, exc)
                continue
            if self.cache is not None:
                self.cache.put(key, text)
            return parsed, False
        self.usage.failed += 1
        log.warning("the judge gave no usable %s judgement after %d tries", kind, self.max_retries + 1)
        return None

    async def _request(self, messages: list[dict[str, str]]) -> str | None:
        """The judge's answer text, or ``None`` after an HTTP problem (logged)."""
        body = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        async with self._semaphore():
            self.usage.calls += 1
            try:
                async with httpx.AsyncClient(timeout=self.timeout_s, headers=self._headers) as client:
                    response = await client.post(f"{self.base_url}/chat/completions", json=body)
            except httpx.HTTPError as exc:
                log.info("judge request failed: %s: %s", type(exc).__name__, exc)
                return None
        if response.status_code != 200:
            log.info("judge answered %d: %s", response.status_code, response.text[:300])
            return None
        try:
            data = response.json()
            usage = data.get("usage") or {}
            self.usage.prompt_tokens += int(usage.get("prompt_tokens") or 0)
            self.usage.completion_tokens += int(usage.get("completion_tokens") or 0)
            content = data["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            self.usage.malformed += 1
            log.info("the judge's response is not a chat completion: %s", exc)
            return None
        return content if isinstance(content, str) else None
