"""Readiness (``GET /readyz``), gauges refreshed before a scrape, and the
configuration warnings logged at start: what the gateway can serve now.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.auditing import AuditHub
from gateway.config import ReplicaConfig
from gateway.flow import FlowControl
from gateway.metrics import GatewayMetrics
from gateway.overload import OverloadGuard
from gateway.pep import DecisionPoint
from gateway.replicas import ReplicaSet
from routing.load import LoadTracker
from gateway.identity.bundle import TrustBundleStore
from gateway.identity.bundle_parse import BundleUnavailable
from tenancy.registry import TenantRegistry

if TYPE_CHECKING:
    from tenancy.shared_failover import Availability

__all__ = ["Readiness", "configuration_warnings", "limit_warnings"]


class Readiness:
    """Why the gateway cannot route now; ``started()`` tells whether the gateway was started."""

    def __init__(self, started: Callable[[], bool], replica_set: ReplicaSet, audit: AuditHub, pdp: DecisionPoint,
                 loads: LoadTracker, metrics: GatewayMetrics, bundles: TrustBundleStore | None = None,
                 state: Availability | None = None, *, overload: OverloadGuard | None = None, flow: FlowControl | None = None) -> None:
        self.overload = overload
        self.flow = flow
        self._started = started
        self.state = state  # whether Redis answers (state.backend redis), else None
        self.bundles = bundles
        self.replica_set = replica_set
        self.audit = audit
        self.pdp = pdp
        self.loads = loads
        self.metrics = metrics

    async def problems(self) -> list[str]:
        """:meth:`local_problems` plus the decision point's health
        (remote OPA: a cached ``/health`` probe or the last decision's outcome;
        embedded: a policy is loaded). Empty list: ready."""
        problems = self.local_problems()
        if self._started():
            ok, reason = await self.pdp.health()
            if not ok:
                problems.append(f"policy decision point unavailable: {reason}")
            problems.extend(await self.bundle_problems())
        return problems

    async def bundle_problems(self) -> list[str]:
        """Not ready when no configured trust domain has a usable bundle (none loaded, or
        stale beyond its ``max_stale_s``): every request would then get 503
        ``bundle_unavailable``. Each source refreshes only when due (single-flight), so this
        is cheap. With several trust domains, one usable domain keeps the gateway ready
        (its workloads are served); the others are named in the failing answer only."""
        if self.bundles is None:
            return []
        down = []
        domains = sorted(self.bundles.trust_domains())
        for td in domains:
            try:
                await self.bundles.get(td)
            except BundleUnavailable:
                down.append(td)
        if domains and len(down) == len(domains):
            return [f"trust bundle unavailable: {', '.join(down)}"]
        return []

    def local_problems(self) -> list[str]:
        """Why the gateway cannot route now, without asking the decision point (empty list: ready)."""
        problems = []
        if not self._started():
            problems.append("not started")
        if not self.replica_set.routable_ids():
            problems.append("no healthy replica")
        if not self.audit.accepting:
            problems.append("audit trail not accepting events")
        if self.state is not None and not self.state.available and self.state.mode == "fail_closed":
            problems.append("shared state (Redis) unavailable: admissions answer 503")
        if self.overload is not None:
            problems.extend(self.overload.problems())
        return problems

    def refresh_gauges(self) -> None:
        """Update gauges before a scrape."""
        m = self.metrics
        routable = set(self.replica_set.routable_ids())
        m.healthy_replicas.set(len(routable))
        for r in self.replica_set.all():
            m.replica_healthy.labels(r.id).set(1 if r.id in routable else 0)
            m.replica_load_tokens.labels(r.id).set(self.loads.snapshot(r.id).tokens)
        m.audit_dropped.set(self.audit.dropped)
        if self.flow is not None:
            self.flow.refresh_gauges()


def configuration_warnings(registry: TenantRegistry, replicas: list[ReplicaConfig],
                           served_models: frozenset[str]) -> list[str]:
    """Tenant entries that load but cannot be served as written (logged at start, never fatal):
    a model the gateway does not serve, a pool no replica is in, a regulated tenant without a
    replica labelled with its ``data_residency``."""
    out: list[str] = []
    pools = {r.pool for r in replicas}
    for t in registry.tenants():
        for m in sorted(t.models - served_models):
            out.append(f"tenant {t.id}: model {m!r} is not in `models` (requests for it answer 404)")
        for p in sorted(t.pools - pools):
            out.append(f"tenant {t.id}: no replica is in pool {p!r}")
        if t.regulated and not any(
            r.pool in t.pools and r.labels.get("data_residency") == t.data_residency for r in replicas
        ):
            out.append(f"tenant {t.id}: regulated, but no replica in its pools has labels.data_residency "
                       f"{t.data_residency!r} (its requests are denied no_entitled_replica)")
    return out


def limit_warnings(registry: TenantRegistry, default_max_prompt_tokens: int | None) -> list[str]:
    """Tenants whose prompt tokens are really unbounded (logged at start, never fatal; review R3-4): one
    line per tenant naming what it lacks. ``default_max_prompt_tokens``: ``limits.max_prompt_tokens``
    (tokens per prompt of a tenant that sets none; None: no gateway default).

    * no ``max_prompt_tokens`` counts only when the gateway has no default either: one prompt is then
      bounded only by ``limits.max_body_bytes``. With the default (8192) the tenant is bounded and the
      line, if any, names the effective bound instead (session 22, S21-newcomer-8: the shipped example
      warned for two tenants the default bounds);
    * no ``prompt_tokens_per_s``: its prompt tokens per second are unbounded (there is no gateway-wide
      token rate), only its rate in requests and its concurrency hold it.

    Empty when every tenant has a per-prompt bound and a prompt-token rate."""
    out: list[str] = []
    for t in registry.tenants():
        per_prompt = t.max_prompt_tokens if t.max_prompt_tokens is not None else default_max_prompt_tokens
        no_rate = t.prompt_tokens_per_s is None
        if per_prompt is None and no_rate:
            out.append(f"tenant {t.id}: no max_prompt_tokens and no prompt_tokens_per_s, and no limits.max_prompt_tokens: "
                       "its prompts are bounded only by limits.max_body_bytes and its rate in requests "
                       "(docs/tenancy.md, token limits)")
        elif per_prompt is None:
            out.append(f"tenant {t.id}: no max_prompt_tokens and no limits.max_prompt_tokens: one prompt is bounded "
                       "only by limits.max_body_bytes (docs/tenancy.md, token limits)")
        elif no_rate:
            source = "max_prompt_tokens" if t.max_prompt_tokens is not None else "limits.max_prompt_tokens"
            out.append(f"tenant {t.id}: no prompt_tokens_per_s: its prompt tokens per second are bounded only by "
                       f"its rate in requests and its concurrency (each prompt by {source} {per_prompt}; "
                       "docs/tenancy.md, token limits)")
    return out
