"""Prometheus metrics of the gateway (prometheus_client registries).

Two registries (R3-5): ``public`` (the public ``/metrics`` under ``metrics.public_endpoint:
minimal``, no authentication) carries only liveness and overload figures: healthy replicas,
shared-state availability, requests shed, audit events dropped (the queue gauge is admin-only,
R4-11: with the prefill-token bound it moves with prompt lengths). Nothing in
it moves with one request's content size, prefix reuse, timing, tenant or replica.
``admin`` carries everything else: request counts, prompt and prefix tokens, latency
histograms, upstream failures, decision cache, flow refusals, per-replica and per-tenant
series; ``GET /admin/metrics`` (operators) serves both registries. Latencies are in seconds.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.metrics_hist import TallyHistogram

__all__ = ["GatewayMetrics", "BoundChildren", "CounterBatch"]

#: Bound on cached labelled children per family (tenants x outcomes, replicas x pools, ...).
CHILD_CACHE_MAX = 4096


class CounterBatch:
    """Counter increments added up per child and handed to prometheus_client at the next read (issue 14).

    A request adds to ~15 counters; ``Counter.inc`` checks, locks and adds each time (~1 µs). Here
    an increment is a dict addition; :meth:`flush` makes one ``inc`` per child. Registered first
    in each registry (a collector that yields nothing), it flushes whenever that registry is
    collected: every scrape and every ``get_sample_value`` sees every increment made before it.
    One event loop (the gateway's): not for increments from other threads.
    """

    def __init__(self) -> None:
        self._pending: dict[Any, float] = {}
        self._hooks: list[Callable[[], None]] = []

    def on_flush(self, hook: Callable[[], None]) -> None:
        """Run ``hook()`` at every :meth:`flush`, before the pending increments are handed over: a
        tally of its own (e.g. :class:`gateway.recording.Recorder`'s per-request counts) adds its sums
        through this batch's children there, so every read sees them too."""
        self._hooks.append(hook)

    @property
    def pending(self) -> int:
        """Children with increments not yet handed over."""
        return len(self._pending)

    def child(self, counter: Any) -> _BatchedCounter:
        """A stand-in for ``counter`` (a ``Counter`` child or an unlabelled ``Counter``) whose
        ``inc`` goes through this batch; other attributes are the counter's."""
        return _BatchedCounter(counter, self)

    def add(self, pairs: Any) -> None:
        """Increment each ``(child, amount)`` of ``pairs`` in one call (issue 14, session 14: a request's
        token counters, no ``inc`` frame each): a child of this batch (:meth:`child`) adds to the
        pending sums, any other counter gets ``child.inc(amount)``. A negative amount raises
        :class:`ValueError` (as ``Counter.inc``); the pairs before it were added."""
        pending = self._pending
        for child, amount in pairs:
            if type(child) is not _BatchedCounter or child._batch is not self:
                child.inc(amount)
                continue
            if amount < 0:
                raise ValueError("Counters can only be incremented by non-negative amounts.")
            c = child.counter
            pending[c] = pending.get(c, 0) + amount

    def flush(self) -> None:
        """Run the :meth:`on_flush` hooks, then hand every pending sum to its counter."""
        for hook in self._hooks:
            hook()
        pending, self._pending = self._pending, {}
        for counter, amount in pending.items():
            counter.inc(amount)

    def collect(self) -> list[Any]:
        """The collector protocol: flush, yield no metric."""
        self.flush()
        return []

    def describe(self) -> list[Any]:
        """No metric names of its own."""
        return []


class _BatchedCounter:
    __slots__ = ("counter", "_batch")

    def __init__(self, counter: Any, batch: CounterBatch) -> None:
        self.counter = counter
        self._batch = batch

    def inc(self, amount: float = 1) -> None:
        """Add ``amount`` (>= 0, else :class:`ValueError` as ``Counter.inc``) at the next flush."""
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        pending = self._batch._pending
        pending[self.counter] = pending.get(self.counter, 0) + amount

    def __getattr__(self, name: str) -> Any:
        return getattr(self.counter, name)


class BoundChildren:
    """A labelled metric family whose :meth:`labels` children are cached (issue 14).

    ``prometheus_client``'s ``labels()`` validates, stringifies and locks on every call
    (~1 µs); the gateway asks for the same few children on every request. This wrapper keeps
    the children it handed out in a ``functools.lru_cache`` keyed by the positional label values
    (at most :data:`CHILD_CACHE_MAX`, least recently used out; session 29, S29-caches29b-3: was a dict
    emptied whole). Leaving the cache never removes a child from the family: a series never
    disappears (no counter reset). Every label value is a closed set or the configuration's (tenant,
    replica, pool, endpoint); none is the client's. Every other attribute is the family's own
    (``collect``, ``remove``, ...); ``remove``/``clear`` also drop the cache.
    """

    __slots__ = ("family", "_cached", "_batch")

    def __init__(self, family: Any, batch: CounterBatch | None = None) -> None:
        self.family = family
        self._batch = batch  # a Counter family: its children increment through the batch
        self._cached = functools.lru_cache(maxsize=CHILD_CACHE_MAX)(self._child)

    def _child(self, *values: Any) -> Any:
        child = self.family.labels(*values)
        return child if self._batch is None else self._batch.child(child)

    def labels(self, *values: Any) -> Any:
        """The child of these positional label values (as ``family.labels(*values)``; its errors)."""
        return self._cached(*values)

    def remove(self, *values: Any) -> None:
        """Remove a child from the family and the cache."""
        self._cached.cache_clear()
        self.family.remove(*values)

    def clear(self) -> None:
        """Remove every child of the family and the cache."""
        self._cached.cache_clear()
        self.family.clear()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.family, name)

_LAT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class GatewayMetrics:
    """The gateway's metric families, registered on two fresh registries."""

    def __init__(self) -> None:
        self.public = CollectorRegistry(auto_describe=True)
        self.admin = CollectorRegistry(auto_describe=True)
        p, a = self.public, self.admin
        self.batch = CounterBatch()  # counters' increments, flushed first whenever a registry is read
        p.register(self.batch)
        a.register(self.batch)
        self.requests = BoundChildren(Counter(
            "prefixgate_requests", "Inference requests by endpoint, HTTP status and audit outcome",
            ["endpoint", "status", "outcome"], registry=a,
        ), self.batch)
        # per request after its last byte: counted in lists, handed over at collect time (session 13)
        self.request_seconds = TallyHistogram(
            "prefixgate_request_duration_seconds", "Whole request duration", ["endpoint"],
            buckets=_LAT_BUCKETS, registry=a,
        )
        self.first_byte_seconds = TallyHistogram(
            "prefixgate_time_to_first_byte_seconds", "Time from request arrival to the first upstream byte",
            ["endpoint"], buckets=_LAT_BUCKETS, registry=a,
        )
        self.prompt_tokens = self.batch.child(
            Counter("prefixgate_prompt_tokens", "Prompt tokens of routed requests", registry=a))
        self.prefix_tokens = BoundChildren(Counter(
            "prefixgate_prefix_tokens",
            "Prefix tokens: available (best over allowed replicas), predicted (chosen replica), "
            "delivered (replica-reported cached_tokens)", ["kind"], registry=a,
        ), self.batch)
        self.upstream_failures = BoundChildren(Counter(
            "prefixgate_upstream_failures", "Upstream call failures by kind", ["kind"], registry=a,
        ), self.batch)
        self.healthy_replicas = Gauge("prefixgate_healthy_replicas", "Replicas currently healthy", registry=p)
        self.policy_cache = BoundChildren(Counter(
            "prefixgate_policy_cache_lookups", "Decision cache lookups", ["result"], registry=a,
        ), self.batch)
        self.audit_dropped = Gauge("prefixgate_audit_dropped_events", "Audit events dropped (must stay 0)", registry=p)
        # shared state (issue 16, tenancy/shared_failover.py): 1 while Redis answers (always 1 for memory)
        self.state_available = Gauge("prefixgate_state_available",
                                     "1 while the shared state (Redis) answers admission, 0 during an outage",
                                     registry=p)
        self.state_available.set(1)
        self._state_writer = Gauge(
            "prefixgate_state_queued_updates",
            "Releases and settlements of this process waiting for Redis (pending) or dropped because the "
            "queue was full while Redis was unreachable (dropped, must stay 0)", ["kind"], registry=a)
        self._state_lost_slots = Gauge(
            "prefixgate_state_lost_slots", "Concurrency slots found expired when renewed (their request went on "
            "without a slot: Redis was unreachable longer than state.lease_ttl_s, or restarted empty)", registry=a)
        self.state_unavailable_admissions = BoundChildren(Counter(
            "prefixgate_state_unavailable_admissions",
            "Admission decisions taken while the shared state was unavailable, by state.on_unavailable "
            "behaviour (refused: 503; local: limits / state.instances_expected in this process)",
            ["behaviour"], registry=a,
        ), self.batch)
        # flow control (gateway/flow.py, gateway/overload.py)
        # admin only (R4-11): with the per-replica prefill-token bound the queue forms when the pending
        # prefill of the requests in flight passes it, so the gauge moves with other tenants' prompt lengths
        self.flow_queued = Gauge("prefixgate_flow_queued_requests", "Requests queued at the gateway", registry=a)
        # session 26 (issue 14): a TallyHistogram (gateway/metrics_hist.py; same exposition), observed through
        # its one child ``flow_queue_wait`` (no lock, one bisect: flow control observes every released request)
        self.flow_queue_wait_seconds = TallyHistogram(
            "prefixgate_flow_queue_wait_seconds", "Time requests waited in the gateway's queue before release",
            [], buckets=(0.001,) + _LAT_BUCKETS, registry=a,
        )
        self.flow_queue_wait = self.flow_queue_wait_seconds.labels()
        self.flow_refused = BoundChildren(Counter(
            "prefixgate_flow_refused", "Requests refused by the gateway's queue (queue_full, concurrency, queue_timeout, "
            "deadline)", ["reason"], registry=a,
        ), self.batch)
        self.shed_requests = BoundChildren(Counter(
            "prefixgate_shed_requests", "Requests shed before authentication (in_flight, loop_lag)", ["reason"],
            registry=p,
        ), self.batch)
        # admin-only series (name replicas and tenants)
        self.tenant_queued = BoundChildren(Gauge(
            "prefixgate_tenant_queued_requests", "Requests queued at the gateway per tenant", ["tenant"], registry=a,
        ))
        self.tenant_virtual_tokens = BoundChildren(Gauge(
            "prefixgate_tenant_virtual_tokens", "Virtual token counter per tenant (weighted tokens served: "
            "uncached prompt + output)", ["tenant"], registry=a,
        ))
        self.replica_requests = BoundChildren(Counter(
            "prefixgate_replica_requests", "Requests routed per replica", ["replica", "pool"], registry=a,
        ), self.batch)
        self.replica_load_tokens = BoundChildren(Gauge(
            "prefixgate_replica_load_tokens", "Queued prefill plus in-flight decode tokens per replica",
            ["replica"], registry=a,
        ))
        self.health_probe_timeouts_ignored = BoundChildren(Counter(
            "prefixgate_health_probe_timeouts_ignored", "Health probes that timed out but were not counted "
            "against the replica because real traffic succeeded within health.passive_grace_s",
            ["replica"], registry=a,
        ), self.batch)
        self.tenant_circuits_opened = BoundChildren(Counter(
            "prefixgate_tenant_circuits_opened", "Circuits opened for one (replica, tenant) pair only: the "
            "tenant's requests failed on the replica and no other tenant's failure corroborated a replica fault (R8-2)",
            ["replica", "tenant"], registry=a,
        ), self.batch)
        self.replica_healthy = BoundChildren(Gauge("prefixgate_replica_healthy", "1 when the replica is healthy",
                                                   ["replica"], registry=a))
        self.no_replica = BoundChildren(Counter(  # gateway/pipeline_answer.py no_candidate_error (session 24)
            "prefixgate_no_replica", "Requests answered 503 no_replica before the policy, by tenant and cause "
            "(none_configured: no replica in the tenant's pools; none_healthy: some, none routable)",
            ["tenant", "cause"], registry=a,
        ), self.batch)
        self.tenant_requests = BoundChildren(Counter(
            "prefixgate_tenant_requests", "Requests per tenant and outcome", ["tenant", "outcome"], registry=a,
        ), self.batch)
        # token ledger (tenancy/ledger.py): tokens by tenant and kind (prompt, output)
        self.tenant_tokens_reserved = BoundChildren(Counter(
            "prefixgate_tenant_tokens_reserved", "Tokens reserved at admission (prompt; output = max_tokens x "
            "sequences)", ["tenant", "kind"], registry=a,
        ), self.batch)
        self.tenant_tokens_charged = BoundChildren(Counter(
            "prefixgate_tenant_tokens_charged", "Tokens charged when requests ended (replica usage, else tokens "
            "relayed, else the reservation)", ["tenant", "kind"], registry=a,
        ), self.batch)
        self.tenant_tokens_refunded = BoundChildren(Counter(
            "prefixgate_tenant_tokens_refunded", "Reserved tokens given back (reserved and not used)",
            ["tenant", "kind"], registry=a,
        ), self.batch)
        self.tenant_charges = BoundChildren(Counter(
            "prefixgate_tenant_charges", "Requests settled per tenant and charge basis (usage, relayed, refused, "
            "reservation, not_dispatched)", ["tenant", "basis"], registry=a,
        ), self.batch)
        self.tenant_refused_cpu = BoundChildren(Counter(  # gateway/cpu_budget.py (R5-8)
            "prefixgate_tenant_refused_cpu_seconds", "Gateway CPU (loop thread) of parse and tokenize charged to "
            "each tenant's refused_cpu budget: requests not dispatched, others' beyond limits.prep_cpu_free_*", ["tenant"], registry=a,
        ), self.batch)

    def watch_state(self, limits: Any) -> None:
        """Read the shared limits' queue and lease counters at every scrape
        (``limits``: :class:`tenancy.shared.SharedLimits` of ``state.backend: redis``)."""
        writer = limits.writer
        if writer is not None:
            self._state_writer.labels("pending").set_function(lambda: writer.pending)
            self._state_writer.labels("dropped").set_function(lambda: writer.dropped)
        lim = getattr(limits.limiter, "shared", None)
        if lim is not None:
            self._state_lost_slots.set_function(lambda: lim.lost_slots)
