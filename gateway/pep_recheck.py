"""The policy asked again for a request whose decision is older than a policy change (session 17, S17-6).

The pipeline (gateway/pipeline.py) asks the policy once, before a request waits in the flow-control
queue for its fair turn and a replica with room (up to ``flow.tenant_max_queue_wait_s``). An operator's
change acknowledged meanwhile (a policy or data upload, a set adopted from another instance, a registry
reload: :attr:`gateway.pep.DecisionPoint.generation` moves with each) must hold for the requests already
queued too: a workload put on the deny-list must not be dispatched on its old allow. When the request
leaves the queue the pipeline compares the generation seen before its decision with the current one
(one int compare on the common path) and, when it moved, calls :func:`decide_again`.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from gateway.errors import GatewayError
from gateway.json_fast import dumps, loads_object
from policy.decision import Decision

if TYPE_CHECKING:
    from gateway.build import Gateway
    from gateway.held import Held
    from gateway.record import RequestRecord
    from gateway.request import InferenceRequest, JsonObject
    from routing.policies import RouteRequest
    from tenancy.registry import Tenant

__all__ = ["awaited_decision", "decide_again", "with_max_tokens"]


async def awaited_decision(pending: Awaitable[Decision], rec: RequestRecord) -> Decision:
    """The decision :meth:`gateway.pep.PolicyEnforcementPoint.decide_now` did not answer at once, awaited;
    a failure's code (503 ``policy_unavailable``) is recorded in ``rec`` before it is raised.

    Raises:
        GatewayError: the decision point failed (fail closed).
    """
    try:
        return await pending
    except GatewayError as err:
        rec.reason_code = err.code
        raise


async def decide_again(gw: Gateway, held: Held, tenant: Tenant, req: InferenceRequest, rec: RequestRecord,
                       route_req: RouteRequest, replica_id: str, body: JsonObject | bytes) -> JsonObject | bytes:
    """Decide ``req`` again with the policy now in force and enforce that answer (S17-6).

    ``held.decided``: ``(generation, identity, candidates)`` of the first decision. Same input as the
    first decision (the tenant's queued count as of now); a decision-cache hit in the common case.
    The record takes the new decision (the audit event records the decision enforced). A deny raises its 403 (:meth:`gateway.pep.PolicyEnforcementPoint.enforce`); a replica
    ``replica_id`` (the one flow control released the request to) the new decision no longer allows
    raises 503 ``no_replica``; a lower ``max_tokens`` cap is written into ``body`` (a dict, or the
    queued JSON bytes) and the ledger's reservation is lowered; a higher one is not taken (the
    narrower of the two holds: the request was admitted and queued with the lower one).

    Returns:
        the upstream body to send (``body``, or a copy with the lower ``max_tokens``).

    Raises:
        GatewayError: 403 (deny), 503 ``policy_unavailable`` (the decision point fails: fail
            closed), 503 ``no_replica``.
    """
    assert held.decided is not None
    _, identity, candidates = held.decided
    decision = gw.pep.decide_now(identity, tenant, req, route_req.prompt_tokens, candidates, rec.endpoint,
                                 gw.flow.tenant_queued(tenant.id) if gw.flow is not None else 0)
    if type(decision) is not Decision:
        decision = await awaited_decision(decision, rec)  # type: ignore[arg-type]
    rec.decision_id, rec.reason_code, rec.reason = decision.decision_id, decision.reason_code, decision.reason
    gw.pep.enforce(decision)
    if all(r.id != replica_id for r in gw.pep.allowed_candidates(candidates, decision)):
        raise GatewayError(503, "no_replica", "no healthy replica is allowed for this request",
                           extra={"decision_id": decision.decision_id})
    max_tokens = gw.admission.clamp_max_tokens(req.max_tokens, tenant, decision)
    if rec.max_tokens is None or max_tokens >= rec.max_tokens:
        return body
    rec.max_tokens = max_tokens
    if held.reservation is not None:
        gw.admission.lower_reservation(held.reservation, max_tokens * route_req.sequences)
    return with_max_tokens(body, max_tokens)


def with_max_tokens(body: JsonObject | bytes, max_tokens: int) -> JsonObject | bytes:
    """``body`` with ``max_tokens`` replaced: a new dict, or for the queued JSON bytes
    (:func:`gateway.flow_bytes.queued_form`) the bytes of the same object with that one value changed
    (key order kept: what :func:`gateway.proxy.open_upstream` would send)."""
    if isinstance(body, bytes):
        doc: dict[str, Any] = loads_object(body)  # what the request's own parse accepted
        doc["max_tokens"] = max_tokens
        return bytes(dumps(doc))
    return {**body, "max_tokens": max_tokens}
