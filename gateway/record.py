"""The record of one request: what its one audit event and its metrics are made of.

Only :mod:`gateway.pipeline` writes a :class:`RequestRecord`; the steps it
calls return values. A refusal outside the inference path (``/v1/models``,
the admin listener) gets its record from :func:`refusal_record`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from audit.ids import uuid4_hex
from gateway.errors import GatewayError, StepFailed
from tenancy.ledger import Settlement

if TYPE_CHECKING:
    from policy.decision import Decision

__all__ = ["RequestRecord", "refusal_record", "new_request_id"]


#: a fresh request id: ``new_request_id() -> str``, a random UUID v4 as 32 hex characters (batched
#: ``os.urandom``: :mod:`audit.ids`); the function itself, no wrapper call per request (session 17)
new_request_id = uuid4_hex


@dataclass(slots=True)
class RequestRecord:
    """Everything the audit event of one request needs (never prompt text).

    Times are ``time.perf_counter()`` seconds; latencies are derived in ms.
    The stamps mark the end of one step each, so the gap between two stamps
    is one step's time: ``t_auth`` (authenticated), ``t_parsed`` (tenant
    resolved, admitted, body read and parsed), ``t_keys`` (tokenized, tokens
    reserved, prefix keys hashed), ``t_decided`` (the policy decision only),
    ``t_route`` (routed), ``t_first_byte`` (the replica's first response
    byte: not a token), ``t_end``.

    Prefix figures, one name per quantity (docs/audit.md): ``available_prefix_tokens``
    (cached on some allowed replica), ``predicted_prefix_tokens`` (expected on the
    chosen one), ``delivered_prefix_tokens`` (the replica's ``cached_tokens``).
    ``relayed_output``: output tokens relayed in an SSE answer (estimate, see
    :class:`gateway.sse.SseScanner`); ``settlement``: the token ledger's
    :class:`tenancy.ledger.Settlement` of the request (None: nothing reserved).
    ``queue_wait_ms``: time queued at the gateway before release (flow control; None:
    never queued or flow control off); ``virtual_tokens``: the tenant's virtual token
    counter right after the release (weighted tokens, :mod:`routing.fairness`). ``dropped_fields``: top-level
    body fields dropped outside the request schema (``limits.unknown_fields: drop``; None or 0: none; session 24).
    ``policy_version``: the policy store's version that decided (:attr:`policy.decision.Decision.policy_version`).
    """

    request_id: str
    endpoint: str
    client_addr: str | None
    t0: float
    spiffe_id: str | None = None
    trust_domain: str | None = None
    tenant_id: str | None = None
    model: str | None = None
    stream: bool = False
    prompt_tokens: int | None = None
    sequences: int | None = None
    max_tokens: int | None = None
    output_tokens: int | None = None
    delivered_prefix_tokens: int | None = None
    decision_id: str | None = None
    reason_code: str | None = None
    reason: str | None = None
    replica: str | None = None
    pool: str | None = None
    routing_policy: str | None = None
    predicted_prefix_tokens: int | None = None
    available_prefix_tokens: int | None = None
    replica_load_tokens: int | None = None
    attempts: int = 0
    status: int | None = None
    outcome: str = "failed"
    error_code: str | None = None
    prefix_fingerprint: str | None = None
    t_auth: float | None = None
    t_parsed: float | None = None
    t_keys: float | None = None
    t_decided: float | None = None
    t_route: float | None = None
    t_first_byte: float | None = None
    t_end: float | None = None
    relayed_output: int | None = None
    settlement: Settlement | None = None
    queue_wait_ms: float | None = None
    virtual_tokens: float | None = None
    dropped_fields: int | None = None
    policy_version: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def decided(self, decision: Decision | None) -> None:
        """Take ``decision``'s decision id, reason code, reason and policy version (None: clear them, a
        decision superseded before it is asked again)."""
        if decision is None:
            self.decision_id = self.reason_code = self.reason = self.policy_version = None
        else:
            self.decision_id, self.reason_code, self.reason = decision.decision_id, decision.reason_code, decision.reason
            self.policy_version = decision.policy_version

    def refused(self, err: GatewayError) -> None:
        """The request ended with ``err``: its status, outcome, code and the record fields it
        carries (``err.record``, e.g. queue figures; names of this class's fields). A ``reason``
        already set (the policy decision's) is kept: the error code tells the refusal then."""
        self.status, self.outcome, self.error_code = err.status, err.outcome, err.code
        for name, value in err.record.items():
            if name != "reason" or self.reason is None:
                setattr(self, name, value)

    def failed(self, err: Exception) -> None:
        """The request ended with a bug ``err`` (not a :class:`GatewayError`): 500 ``internal_error``,
        outcome ``failed``, and, for a :class:`gateway.errors.StepFailed`, the record fields its step had
        learnt before the bug (``err.record``; session 20, S19-T4-1: a bug keeps what a refusal keeps)."""
        self.status, self.outcome, self.error_code = 500, "failed", "internal_error"
        if isinstance(err, StepFailed):
            for name, value in err.record.items():
                setattr(self, name, value)

    def ms(self, start: float | None, end: float | None) -> float | None:
        """Milliseconds between two perf-counter stamps (None if either is missing)."""
        if start is None or end is None:
            return None
        return round((end - start) * 1000.0, 3)


def refusal_record(endpoint: str, client_addr: str | None, status: int, outcome: str, error_code: str,
                   spiffe_id: str | None = None, trust_domain: str | None = None) -> RequestRecord:
    """A finished record of a refusal on a non-inference endpoint (``endpoint`` cut to 128 characters)."""
    rec = RequestRecord(request_id=new_request_id(), endpoint=endpoint[:128], client_addr=client_addr,
                        t0=time.perf_counter())
    rec.spiffe_id, rec.trust_domain = spiffe_id, trust_domain
    rec.status, rec.outcome, rec.error_code, rec.t_end = status, outcome, error_code, time.perf_counter()
    return rec
