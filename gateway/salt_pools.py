"""The salt-pool rule: a replica with ``cache_salt: false`` may serve only one tenant's pool.

The per-tenant ``cache_salt`` is what keeps one tenant's KV blocks out of another's prefix
cache (docs/security.md T1); a replica that cannot take it must never be shared. The rule is
one pure function, run at start-up (:func:`gateway.build.build`, on the configured replicas and
tenants) and before a tenant registry is put in force at run time
(:meth:`gateway.admin.Admin.apply_registry`, on the NEW tenant list against the live replica
set: an operator's reload and a registry record adopted from shared state), so a running
gateway never reaches a state its own start-up refuses (R10-1). The replica set does not
change at run time (no reload or admin route adds or moves a replica).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

__all__ = ["salt_pool_error"]


class _Replica(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def pool(self) -> str: ...
    @property
    def cache_salt(self) -> bool: ...


class _Tenant(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def pools(self) -> Sequence[str]: ...


def salt_pool_error(replicas: Iterable[_Replica], tenants: Iterable[_Tenant]) -> str | None:
    """The first breach of the rule, as an operator-facing message, or ``None`` when it holds.

    ``replicas``: objects with ``id``, ``pool``, ``cache_salt`` (:class:`gateway.replicas.Replica`
    or the configuration's replica entries); ``tenants``: objects with ``id`` and ``pools``
    (:class:`tenancy.tenant.Tenant`). A salt-less replica whose pool more than one tenant may be
    routed to breaks it (replicas in configuration order). A tenant with empty ``pools`` may be routed
    to every pool (:class:`routing.filters.TenantPoolFilter`, the router's own rule): it counts in
    every pool here too (session 14, review RV2-4; before, it counted in none, so a salt-less replica
    "shared" with a pool-less tenant passed)."""
    tenants = list(tenants)
    for r in replicas:
        if r.cache_salt:
            continue
        users = sorted({t.id for t in tenants if not t.pools or r.pool in t.pools})
        if len(users) > 1:
            return (f"replica {r.id} has cache_salt off but its pool {r.pool!r} serves several tenants "
                    f"({', '.join(users)}); a salt-less replica may only serve one tenant")
    return None
