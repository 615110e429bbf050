"""Prometheus metrics of the gateway (prometheus_client registries).

Two registries: ``public`` (served on the public ``/metrics``) carries no
tenant names, SPIFFE IDs or replica ids — only totals by endpoint, status
and outcome; ``admin`` (served on the admin listener to operators) carries
per-replica and per-tenant series. Latencies are in seconds.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["GatewayMetrics"]

_LAT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class GatewayMetrics:
    """The gateway's metric families, registered on two fresh registries."""

    def __init__(self) -> None:
        self.public = CollectorRegistry(auto_describe=True)
        self.admin = CollectorRegistry(auto_describe=True)
        p, a = self.public, self.admin
        self.requests = Counter(
            "prefixgate_requests", "Inference requests by endpoint, HTTP status and audit outcome",
            ["endpoint", "status", "outcome"], registry=p,
        )
        self.request_seconds = Histogram(
            "prefixgate_request_duration_seconds", "Whole request duration", ["endpoint"],
            buckets=_LAT_BUCKETS, registry=p,
        )
        self.first_byte_seconds = Histogram(
            "prefixgate_time_to_first_byte_seconds", "Time from request arrival to the first upstream byte",
            ["endpoint"], buckets=_LAT_BUCKETS, registry=p,
        )
        self.prompt_tokens = Counter("prefixgate_prompt_tokens", "Prompt tokens of routed requests", registry=p)
        self.prefix_tokens = Counter(
            "prefixgate_prefix_tokens",
            "Prefix tokens: available (best over allowed replicas), predicted (chosen replica), "
            "delivered (replica-reported cached_tokens)", ["kind"], registry=p,
        )
        self.upstream_failures = Counter(
            "prefixgate_upstream_failures", "Upstream call failures by kind", ["kind"], registry=p,
        )
        self.healthy_replicas = Gauge("prefixgate_healthy_replicas", "Replicas currently healthy", registry=p)
        self.policy_cache = Counter(
            "prefixgate_policy_cache_lookups", "Decision cache lookups", ["result"], registry=p,
        )
        self.audit_dropped = Gauge("prefixgate_audit_dropped_events", "Audit events dropped (must stay 0)", registry=p)
        # admin-only series (name replicas and tenants)
        self.replica_requests = Counter(
            "prefixgate_replica_requests", "Requests routed per replica", ["replica", "pool"], registry=a,
        )
        self.replica_load_tokens = Gauge(
            "prefixgate_replica_load_tokens", "Queued prefill plus in-flight decode tokens per replica",
            ["replica"], registry=a,
        )
        self.replica_healthy = Gauge("prefixgate_replica_healthy", "1 when the replica is healthy", ["replica"], registry=a)
        self.tenant_requests = Counter(
            "prefixgate_tenant_requests", "Requests per tenant and outcome", ["tenant", "outcome"], registry=a,
        )
        # token ledger (tenancy/ledger.py): tokens by tenant and kind (prompt, output)
        self.tenant_tokens_reserved = Counter(
            "prefixgate_tenant_tokens_reserved", "Tokens reserved at admission (prompt; output = max_tokens x "
            "sequences)", ["tenant", "kind"], registry=a,
        )
        self.tenant_tokens_charged = Counter(
            "prefixgate_tenant_tokens_charged", "Tokens charged when requests ended (replica usage, else tokens "
            "relayed, else the reservation)", ["tenant", "kind"], registry=a,
        )
        self.tenant_tokens_refunded = Counter(
            "prefixgate_tenant_tokens_refunded", "Reserved tokens given back (reserved and not used)",
            ["tenant", "kind"], registry=a,
        )
        self.tenant_charges = Counter(
            "prefixgate_tenant_charges", "Requests settled per tenant and charge basis (usage, relayed, refused, "
            "reservation, not_dispatched)", ["tenant", "basis"], registry=a,
        )
