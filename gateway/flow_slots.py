"""Which tenants the flow-control dispatcher skips for want of a concurrency slot (issue 17,
docs/fairness.md "Concurrency slots"): :class:`SlotGate`.

A queued request holds no slot; the dispatcher takes it at release. A tenant refused a slot is
skipped (its requests stay queued, in order) until a slot may have freed: in process for the rest
of one dispatcher round (the answer is exact and cheap), through Redis until the next recheck
(each try is a round trip, and other instances' releases are not signalled). After a Redis
refusal the tenant's slots are asked for one release at a time until one is granted, so a
recheck costs one Redis call per tenant, not one per queued request.
"""

from __future__ import annotations

__all__ = ["SlotGate"]


class SlotGate:
    """Per-tenant slot state of the dispatcher (one event loop; no I/O)."""

    def __init__(self) -> None:
        self._round: set[str] = set()  # refused in process during this dispatcher round
        self._shared: set[str] = set()  # refused by Redis since the last recheck
        self._probing: set[str] = set()  # refused by Redis, not granted since: one ask at a time
        self._asking: dict[str, int] = {}  # releases whose slots Redis is asked for now

    def skipped(self, tenant_id: str) -> bool:
        """True while the dispatcher should not release ``tenant_id``'s requests needing a slot."""
        return (tenant_id in self._round or tenant_id in self._shared
                or (tenant_id in self._probing and tenant_id in self._asking))

    def at_concurrency(self, tenant_id: str) -> bool:
        """True when ``tenant_id`` was refused a slot and not granted one since."""
        return tenant_id in self._round or tenant_id in self._shared

    def new_round(self) -> None:
        """A dispatcher round starts: in-process refusals are tried again."""
        self._round.clear()

    def recheck(self) -> None:
        """The periodic recheck: Redis refusals are tried again."""
        self._shared.clear()

    def refused_now(self, tenant_id: str) -> None:
        """The in-process limiter refused ``tenant_id`` a slot."""
        self._round.add(tenant_id)

    def asking(self, tenant_id: str) -> None:
        """A release of ``tenant_id`` asks Redis for its slots."""
        self._asking[tenant_id] = self._asking.get(tenant_id, 0) + 1

    def asked(self, tenant_id: str, granted: bool | None = None) -> None:
        """That ask ended: ``granted`` True / False (refused) / None (no answer: error, cancel)."""
        n = self._asking.get(tenant_id, 0) - 1
        if n > 0:
            self._asking[tenant_id] = n
        else:
            self._asking.pop(tenant_id, None)
        if granted is True:
            self._probing.discard(tenant_id)
        elif granted is False:
            self._shared.add(tenant_id)
            self._probing.add(tenant_id)
