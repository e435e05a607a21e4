"""What an APO run found: every prompt version with its scores and the critique that made it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

__all__ = ["APOResult", "PromptVersion", "stored_summary", "versions_table"]


@dataclass
class PromptVersion:
    """One prompt APO tried; ``version`` is the resources version it was published as."""

    version: int
    prompt: str
    round: int
    """0 for the initial prompt, else the round whose edit produced it."""
    parent_version: int | None = None
    """The version it was edited from (``None`` for the initial prompt)."""
    critique: str | None = None
    """The optimizer's critique of the parent that this edit answers."""
    train_scores: dict[int, float] = field(default_factory=dict)
    """Round -> mean reward on that round's training batch (parents only: they are critiqued)."""
    val_scores: dict[int, float] = field(default_factory=dict)
    """Round -> mean reward on that round's validation batch."""
    final_val_score: float | None = None
    """Mean reward on the whole validation set (the initial prompt and the final beam)."""

    @property
    def best_val_score(self) -> float | None:
        """The held-out score: the whole-set score when measured, else the latest batch score."""
        if self.final_val_score is not None:
            return self.final_val_score
        return self.val_scores[max(self.val_scores)] if self.val_scores else None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PromptVersion:
        """Inverse of :meth:`to_dict`."""
        return cls(
            version=int(data["version"]),
            prompt=str(data["prompt"]),
            round=int(data["round"]),
            parent_version=data.get("parent_version"),
            critique=data.get("critique"),
            train_scores={int(k): float(v) for k, v in (data.get("train_scores") or {}).items()},
            val_scores={int(k): float(v) for k, v in (data.get("val_scores") or {}).items()},
            final_val_score=data.get("final_val_score"),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (stored in the final resources version's ``extra``)."""
        data = asdict(self)
        data["train_scores"] = {str(k): v for k, v in self.train_scores.items()}
        data["val_scores"] = {str(k): v for k, v in self.val_scores.items()}
        return data


@dataclass
class APOResult:
    """What ``Trainer.fit`` returns for ``algorithm="apo"``."""

    prompt_name: str
    """The resources prompt APO optimized (``resources.prompts[prompt_name]``)."""
    best_prompt: str
    best_version: int
    """Resources version of the best prompt (as tried)."""
    published_version: int
    """The last resources version: the best prompt, carrying this table in ``extra["apo"]``."""
    score_before: float
    """The initial prompt's score on the whole validation set."""
    score_after: float
    """The best prompt's score on the whole validation set."""
    versions: list[PromptVersion]
    rounds: int
    optimizer_calls: int
    malformed_answers: int
    """Optimizer answers that held no usable prompt (logged, candidate skipped)."""
    prompt_ignored: bool
    """Every prompt version scored the same: the agent probably does not read the prompt."""
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Scalars for the trainer's summary table, then the versions."""
        return {
            "best_version": self.best_version,
            "published_version": self.published_version,
            "score_before": self.score_before,
            "score_after": self.score_after,
            "prompt_versions": len(self.versions),
            "rounds": self.rounds,
            "optimizer_calls": self.optimizer_calls,
            "malformed_answers": self.malformed_answers,
            "best_prompt": self.best_prompt,
            "prompt_name": self.prompt_name,
            "prompt_ignored": self.prompt_ignored,
            "warnings": list(self.warnings),
            "versions": [v.to_dict() for v in self.versions],
        }

    def versions_table(self) -> Table:
        """Every prompt version: parent, round, scores, and the start of its prompt and critique."""
        return versions_table(self.versions, self.prompt_name, self.best_version)

    def rich_summary(self) -> Group:
        """What the trainer prints after its table: the versions, the best prompt and warnings."""
        parts: list[Any] = [
            self.versions_table(),
            Text(
                f"held-out score {self.score_before:.3f} -> {self.score_after:.3f}; "
                f"best prompt (version {self.best_version}, published again as version {self.published_version}):"
            ),
            Text(self.best_prompt, style="bold"),
        ]
        parts += [Text(f"warning: {w}", style="yellow") for w in self.warnings]
        return Group(*parts)


def versions_table(versions: Sequence[PromptVersion], prompt_name: str, best_version: int | None) -> Table:
    """The table of prompt versions the trainer's summary and ``agentbolt runs show`` print."""
    table = Table(title=f"APO: versions of resources.prompts[{prompt_name!r}]")
    for column in ("version", "parent", "round", "train (per round)", "val (per round)", "val (all)"):
        table.add_column(column, overflow="fold")
    table.add_column("prompt", overflow="fold")
    table.add_column("critique", overflow="fold")
    for v in versions:
        table.add_row(
            f"{v.version}{' *' if v.version == best_version else ''}",
            "-" if v.parent_version is None else str(v.parent_version),
            str(v.round),
            " ".join(f"r{r}:{s:.2f}" for r, s in sorted(v.train_scores.items())) or "-",
            " ".join(f"r{r}:{s:.2f}" for r, s in sorted(v.val_scores.items())) or "-",
            "-" if v.final_val_score is None else f"{v.final_val_score:.3f}",
            _short(v.prompt, 80),
            _short(v.critique or "", 80) or "-",
        )
    return table


def stored_summary(extra: Mapping[str, Any]) -> Group | None:
    """The summary of an APO run from its published best version's ``extra`` (``None`` when
    ``extra`` holds no APO table)."""
    apo = extra.get("apo")
    if not isinstance(apo, Mapping) or not isinstance(apo.get("versions"), list):
        return None
    versions = [PromptVersion.from_dict(row) for row in apo["versions"]]
    best = apo.get("best_version")
    parts: list[Any] = [
        versions_table(versions, str(apo.get("prompt_name", "system")), best),
        Text(
            f"held-out score {apo.get('score_before', float('nan')):.3f} -> {apo.get('score_after', float('nan')):.3f}"
        ),
    ]
    parts += [Text(f"warning: {w}", style="yellow") for w in apo.get("warnings") or ()]
    return Group(*parts)


def _short(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
