"""The PEP's memo of policy facts and decision-cache key parts (issue 14, the decision-cache hit path).

A request's decision-cache key (:func:`policy.cache.fast_key`) is made of four parts; two of them
depend only on objects the gateway never changes in place:

- the tenant's facts (``Tenant.policy_view()`` plus ``max_tokens``) and their key part
  (:func:`policy.cache.tenant_key_part`): kept per :class:`tenancy.registry.Tenant` object (frozen; a
  registry reload hands out new objects, which get fresh facts);
- the candidates' key part (:func:`policy.cache.candidates_key_part`): kept per list of
  :class:`gateway.replicas.Replica` objects (frozen; a replica set change hands out new objects).
  The part is computed from the same documents the policy input's candidates are built from
  (:func:`candidate_docs`) with a ``load`` of 0: the load is not in the key, and the real one (the
  gateway's own :class:`routing.load.LoadTracker` counter, an ``int``) is read only when the
  document is built, on a miss, where ``build_policy_input`` validates it.

So a hit builds neither the input document nor the candidates' documents nor the tenant's lists;
it validates the per-request facts (identity, request fields, alerts) each time
(:func:`policy.cache.head_key_part`, :func:`policy.cache.alerts_key_part`). Property test:
tests/policy/test_s6_pep_key.py (the key equals the built document's key).
"""

from __future__ import annotations

from operator import attrgetter, is_
from typing import Any

from gateway.replicas import Replica
from policy.cache import candidates_key_part, tenant_key_part
from routing.load import LoadTracker
from tenancy.registry import Tenant

__all__ = ["FactsMemo", "candidate_docs"]

#: most tenants / candidate lists whose facts :class:`FactsMemo` keeps (each map emptied when full)
MEMO_MAX = 4096
_ID = attrgetter("id")


def candidate_docs(candidates: list[Replica], loads: LoadTracker | None) -> list[dict[str, Any]]:
    """The policy input's candidate facts: ``[{"id", "pool", "labels", "healthy": True, "load"}]``
    (``load``: running requests from ``loads``; 0 without a tracker)."""
    return [
        {"id": r.id, "pool": r.pool, "labels": dict(r.labels), "healthy": True,
         "load": loads.snapshot(r.id).running_requests if loads is not None else 0}
        for r in candidates
    ]


class FactsMemo:
    """Tenant facts and key parts per Tenant object; candidate key parts per list of Replica objects.

    Not thread-safe (the event loop's). The maps are bounded by :data:`MEMO_MAX` entries each.
    """

    __slots__ = ("_tenants", "_candidates")

    def __init__(self) -> None:
        # tenant id -> (the Tenant, its facts, their key part or None)
        self._tenants: dict[str, tuple[Tenant, dict[str, Any], tuple[Any, ...] | None]] = {}
        # candidate ids -> (the Replica objects, their key part or None)
        self._candidates: dict[tuple[str, ...], tuple[tuple[Replica, ...], tuple[Any, ...] | None]] = {}

    def tenant(self, tenant: Tenant) -> tuple[dict[str, Any], tuple[Any, ...] | None]:
        """``(facts, key part)`` of ``tenant``: facts = ``tenant.policy_view()`` plus ``max_tokens``
        (shared: callers only read it); key part ``None`` when a fact is mistyped (the caller then
        builds the document, whose validation raises)."""
        got = self._tenants.get(tenant.id)
        if got is not None and got[0] is tenant:
            return got[1], got[2]
        tview = tenant.policy_view()
        tview["max_tokens"] = tenant.max_output_tokens
        part = tenant_key_part(tview)
        if len(self._tenants) >= MEMO_MAX:
            self._tenants.clear()
        self._tenants[tenant.id] = (tenant, tview, part)
        return tview, part

    def candidates(self, candidates: list[Replica]) -> tuple[Any, ...] | None:
        """The key part of ``candidates`` (in any order), or ``None`` when a replica fact is mistyped."""
        ids = tuple(map(_ID, candidates))  # session 13: no comprehension frame per request
        got = self._candidates.get(ids)
        if got is not None and len(got[0]) == len(candidates) and all(map(is_, got[0], candidates)):
            return got[1]
        part = candidates_key_part(candidate_docs(candidates, None))
        if len(self._candidates) >= MEMO_MAX:
            self._candidates.clear()
        self._candidates[ids] = (tuple(candidates), part)
        return part
