"""Filters: which candidates may take a request.

* :mod:`routing.filters.tenant_pool`: replicas in the tenant's pools;
* :mod:`routing.filters.health`: replicas the replica set calls routable;
* :mod:`routing.filters.policy_decision`: replicas the policy decision allows;
* :mod:`routing.filters.load_guard`: bounded-load guard (a policy's own filter);
* :mod:`routing.filters.dispatch_share`: bounded share of recent dispatches for
  placements (``cache_aware``'s own filter).

The first three run in the gateway on replica descriptions (anything with
``id`` and ``pool``) around the policy decision point, which needs the
candidate list; the load guard runs inside a policy on :class:`Candidate`\\ s.
"""

from __future__ import annotations

from routing.filters.dispatch_share import DispatchShareFilter
from routing.filters.health import HealthFilter
from routing.filters.load_guard import LoadGuardFilter
from routing.filters.policy_decision import PolicyDecisionFilter
from routing.filters.tenant_pool import Placed, TenantPoolFilter

__all__ = ["DispatchShareFilter", "HealthFilter", "LoadGuardFilter", "Placed", "PolicyDecisionFilter", "TenantPoolFilter"]
