"""Tenant pool filter: keep the replicas in the pools a tenant may use."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar

__all__ = ["Placed", "TenantPoolFilter"]


class Placed(Protocol):
    """A replica description: its ``id`` and ``pool`` (``gateway.replicas.Replica`` is one)."""

    @property
    def id(self) -> str: ...

    @property
    def pool(self) -> str: ...


R = TypeVar("R", bound=Placed)


class TenantPoolFilter:
    """Keeps the replicas whose pool is one of ``pools``; an empty or absent
    ``pools`` (a tenant that lists none) keeps every replica."""

    name = "tenant_pool"

    def __init__(self, pools: Iterable[str] | None) -> None:
        self.pools = frozenset(pools) if pools else None

    def filter(self, replicas: Sequence[R]) -> list[R]:
        """The replicas in the tenant's pools, order kept."""
        if self.pools is None:
            return list(replicas)
        return [r for r in replicas if r.pool in self.pools]
