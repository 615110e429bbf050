"""Policy decision filter: enforce the replicas and pools a decision allows.

A policy decision can narrow the candidates it was shown, never widen them:
this filter only removes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

from routing.filters.tenant_pool import Placed

__all__ = ["PolicyDecisionFilter"]

R = TypeVar("R", bound=Placed)


class PolicyDecisionFilter:
    """Keeps the replicas allowed by a decision: id in ``allowed_replicas``
    and pool in ``allowed_pools``; an absent (``None``) list does not restrict."""

    name = "policy_decision"

    def __init__(self, allowed_replicas: Iterable[str] | None, allowed_pools: Iterable[str] | None) -> None:
        self.allowed_replicas = None if allowed_replicas is None else frozenset(allowed_replicas)
        self.allowed_pools = None if allowed_pools is None else frozenset(allowed_pools)

    def filter(self, replicas: Sequence[R]) -> list[R]:
        """The allowed replicas, order kept."""
        return [
            r for r in replicas
            if (self.allowed_replicas is None or r.id in self.allowed_replicas)
            and (self.allowed_pools is None or r.pool in self.allowed_pools)
        ]
