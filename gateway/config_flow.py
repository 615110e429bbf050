"""The ``flow`` section of the gateway configuration: gateway-side queues, fair release,
per-tenant queue limits and overload shedding (docs/fairness.md, docs/configuration.md)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["FlowConfig"]


class FlowConfig(BaseModel):
    """Flow control (issue 17).

    ``enabled``: queue requests per tenant at the gateway and release them to
    replicas only while a replica has room, in weighted Virtual Token Counter
    order (``routing.fairness``). Room of one replica, for THIS gateway
    instance (each bound is divided by ``instances``, rounded up: several
    instances each use 1/N of a replica's room until shared counters exist):
    ``replica_max_running_requests`` requests dispatched and not finished,
    ``replica_max_queued_prefill_tokens`` predicted uncached prompt tokens
    not yet prefilled (None: no token bound; a replica with nothing queued
    always takes one request, however long), ``replica_max_engine_waiting_requests``:
    no room while the replica's own engine reports at least this many waiting
    requests (vLLM ``num_requests_waiting`` / SGLang ``num_queue_reqs``; read
    only when ``routing.policy.calibrate`` scrapes engine metrics; None: not
    used). The defaults are generous (a replica is rarely that full): set
    them to the replica's real capacity for fairness under saturation.
    ``locality_slack_tokens``: how many weighted tokens a warm request may
    jump ahead of a cold one. ``locality_wait_ratio``: a request whose prefix
    replica is full waits for it while the prefill that replica must drain
    first is at most this many times the prefix (else it goes cold, recomputing
    the prefix elsewhere); larger keeps more hits at the price of waiting (4: the
    Mooncake replay's hit rate within 5 % of no flow control, docs/fairness.md). Per tenant: ``tenant_max_queued_requests``
    (429 ``queue_full`` beyond it; must stay below ``shed_max_in_flight_requests``,
    else one tenant's queue alone could make the gateway shed every tenant's
    requests) and ``tenant_max_queue_wait_s`` (429
    ``queue_timeout`` past it), ``tenant_max_queued_bytes`` (the body bytes of one
    tenant's queued requests, summed while they wait: 429 ``queue_full`` beyond it;
    a tenant with nothing queued may always queue one request; default 64 MiB, as
    ``limits.max_buffered_body_bytes_per_tenant``: review R12-2, gateway/flow_bytes.py);
    queue wait also counts against
    ``upstream.total_timeout_s``. ``tenant_max_in_flight_requests``: one tenant's
    requests in this process past authentication (queued, being parsed, running,
    streaming), whatever its ``max_concurrency`` (429 ``in_flight_limited`` at the
    door beyond it); must stay below ``shed_max_in_flight_requests`` so that one
    tenant alone cannot make the gateway shed every tenant's requests (review
    finding R2-1); None: a quarter of ``shed_max_in_flight_requests`` (256 by default).

    ``tenant_share_idle_s`` (session 25, finding S25-newcomer-1; gateway/flow_share.py): with a
    ``replica_max_queued_prefill_tokens`` bound, while another tenant is active one tenant may hold at
    most its weight's share of a replica's queued-prefill room (a tenant holding nothing there may
    always place one request; a tenant alone may use it all); a tenant stays active while it has a
    request queued or a prefill held, and for this many seconds after its last request event
    (None: no share rule, one tenant may fill every replica's room).

    Overload shedding (before authentication, 503 ``overloaded`` with
    ``Retry-After``; ``/readyz`` not ready meanwhile): ``shed_max_in_flight_requests``
    inference requests in this process, or an event-loop lag (smoothed, probed
    every ``loop_lag_probe_s``) above ``shed_loop_lag_s`` (None: off).
    ``shed_retry_after_s``: the ``Retry-After`` of a shed request.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    instances: int = Field(1, ge=1, le=1024)
    replica_max_running_requests: int = Field(1024, ge=1)
    replica_max_queued_prefill_tokens: int | None = Field(None, ge=1)
    replica_max_engine_waiting_requests: int | None = Field(None, ge=0)
    tenant_share_idle_s: float | None = Field(5.0, ge=0)
    locality_slack_tokens: float = Field(2048.0, ge=0)
    locality_wait_ratio: float = Field(4.0, ge=0)
    tenant_max_queued_requests: int = Field(128, ge=0)
    tenant_max_queue_wait_s: float = Field(60.0, gt=0)
    tenant_max_queued_bytes: int = Field(64 << 20, ge=1)
    tenant_max_in_flight_requests: int | None = Field(None, ge=1)
    shed_max_in_flight_requests: int = Field(1024, ge=2)
    shed_loop_lag_s: float | None = Field(1.0, gt=0)
    loop_lag_probe_s: float = Field(0.1, gt=0, le=5)
    shed_retry_after_s: int = Field(1, ge=1, le=3600)

    @model_validator(mode="after")
    def _one_tenant_cannot_trigger_shedding(self) -> "FlowConfig":
        if self.tenant_max_queued_requests >= self.shed_max_in_flight_requests:
            raise ValueError("tenant_max_queued_requests must be below shed_max_in_flight_requests "
                             "(one tenant's queue alone would shed every tenant's requests)")
        if self.tenant_max_in_flight_requests is None:
            self.tenant_max_in_flight_requests = max(1, self.shed_max_in_flight_requests // 4)
        elif self.tenant_max_in_flight_requests >= self.shed_max_in_flight_requests:
            raise ValueError("tenant_max_in_flight_requests must be below shed_max_in_flight_requests "
                             "(one tenant's requests alone would shed every tenant's requests)")
        return self

    def tenant_in_flight_bound(self) -> int:
        """``tenant_max_in_flight_requests`` as validated (its default filled in), requests."""
        return self.tenant_max_in_flight_requests or max(1, self.shed_max_in_flight_requests // 4)

    def per_instance(self, bound: int) -> int:
        """This instance's share of a per-replica ``bound``: ceil(bound / instances), at least 1."""
        return max(1, -(-bound // self.instances))
