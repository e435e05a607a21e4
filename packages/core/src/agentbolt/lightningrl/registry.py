"""Registration of the built-in credit assigners and advantage estimators, and name lookups.

Built-ins register through ``agentbolt_register_credit`` like any plugin; the registry kind
(credit assigner or advantage estimator) comes from each class's ``registry_kind``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import UserError
from ..plugins.hookspecs import Register
from ..plugins.registry import default_plugins
from .advantage import GRPO, RLOO, ReinforcePlusPlus
from .air import AIRCredit
from .credit import DiscountedCredit, FinalCredit, IntermediateCredit

if TYPE_CHECKING:
    from ..plugins.registry import Plugins
    from .advantage import AdvantageEstimator
    from .credit import CreditAssigner

__all__ = ["get_advantage_estimator", "get_credit_assigner", "register_builtins"]


def register_builtins(register: Register) -> None:
    """Register every built-in credit assigner and advantage estimator."""

    for cls in (FinalCredit, DiscountedCredit, IntermediateCredit, AIRCredit, GRPO, RLOO, ReinforcePlusPlus):
        register(cls.name, cls)


def _build(kind: str, name: str, factory: Any, config: dict[str, Any]) -> Any:
    try:
        return factory(**config)
    except TypeError as exc:
        raise UserError(f"{kind} {name!r} does not accept options {sorted(config)}: {exc}") from exc


def get_credit_assigner(name: str, /, *, plugins: Plugins | None = None, **config: Any) -> CreditAssigner:
    """The credit assigner registered as ``name``, built with ``config``; an unknown name raises
    :class:`~agentbolt.errors.UserError` listing the valid ones."""

    registry = (plugins or default_plugins()).credit_assigners
    return _build("credit assigner", name, registry.get(name), config)


def get_advantage_estimator(name: str, /, *, plugins: Plugins | None = None, **config: Any) -> AdvantageEstimator:
    """The advantage estimator registered as ``name``, built with ``config``; an unknown name
    raises :class:`~agentbolt.errors.UserError` listing the valid ones."""

    registry = (plugins or default_plugins()).advantage_estimators
    return _build("advantage estimator", name, registry.get(name), config)
