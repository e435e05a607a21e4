"""Plugin entry module: registers the ``apo`` algorithm (cheap to import: the algorithm loads later)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentbolt import hookimpl
from agentbolt.plugins import Register

if TYPE_CHECKING:
    from agentbolt.store import Run, Store


class _APOFactory:
    """``APO.from_config(config)``, and the summary of an APO run for ``agentbolt runs show``."""

    def __call__(self, **config: Any) -> Any:
        from .algorithm import APO

        return APO.from_config(config)

    async def describe_run(self, run: Run, store: Store) -> Any:
        """The table of prompt versions of the run's published best version (``None`` before
        APO published one)."""
        from .result import stored_summary

        published = run.latest.get("apo/published_version")
        if published is None:
            return None
        resources = await store.get_resources(int(published))
        assert resources is not None, "get_resources(version) raises NotFoundError for an unknown version"
        return stored_summary(resources.extra)


@hookimpl
def agentbolt_register_algorithms(register: Register) -> None:
    register("apo", _APOFactory())
