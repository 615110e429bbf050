"""Health filter: keep the replicas the replica set calls routable.

Routing does no health checking itself: the gateway's replica set (health
checks, circuit breakers) feeds the routable ids in, and this filter reads them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

from routing.filters.tenant_pool import Placed

__all__ = ["HealthFilter"]

R = TypeVar("R", bound=Placed)


class HealthFilter:
    """Keeps the replicas whose id is in ``routable_ids`` (healthy, breaker
    closed or half-open without a probe in flight)."""

    name = "health"

    def __init__(self, routable_ids: Iterable[str]) -> None:
        self.routable = frozenset(routable_ids)

    def filter(self, replicas: Sequence[R]) -> list[R]:
        """The routable replicas, order kept."""
        return [r for r in replicas if r.id in self.routable]
