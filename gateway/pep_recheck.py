"""The request authorized again when its decision is older than a change (session 17, S17-6; session 18).

The pipeline (gateway/pipeline.py) authorizes a request once, before it waits in the flow-control
queue for its fair turn and a replica with room (up to ``flow.tenant_max_queue_wait_s``) and before
any retry on another replica. An operator's change
acknowledged meanwhile (a policy or data upload, a set adopted from another instance, a policy
directory reload, a registry reload: :attr:`gateway.pep.DecisionPoint.generation` moves with each)
must hold for the requests already admitted too: a workload put on the deny-list, a model
entitlement revoked or a tenant's pools narrowed must not be dispatched on the old allow. Right
before every attempt's upstream write the pipeline compares the generation seen before the
request's decision with the current one (one int compare on the common path) and, when it moved,
calls :func:`decide_again`. What follows the compare, :func:`gateway.proxy.open_upstream`, writes at
once on an idle connection; a request that must wait for one (``upstream.pool_size`` connections
overall, all busy) is written only if the generation still holds when it has one, else the connection
goes back unused and the same attempt comes back here (session 19, S19-RC6: the pool's ``guard``,
gateway/upstream_pool.py; docs/security.md, "Session 19: rc6")."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from gateway.admission_answers import check_prompt_bytes
from gateway.errors import GatewayError
from gateway.json_fast import dumps, loads_object
from gateway.pipeline_answer import no_candidate_error
from gateway.usage_privacy import drops_cached
from policy.decision import Decision
from routing.filters import TenantPoolFilter
from tenancy.bounds import RequestBounds, chat_units

if TYPE_CHECKING:
    from gateway.build import Gateway
    from gateway.held import Held
    from gateway.prefix_keys import ChainView
    from gateway.record import RequestRecord
    from gateway.replicas import Replica
    from gateway.request import InferenceRequest, JsonObject
    from routing.policies import RouteRequest
    from routing.types import RouteChoice
    from tenancy.registry import Tenant

__all__ = ["MAX_ROUNDS", "awaited_decision", "check_kept_bounds", "decide_again", "with_fields", "with_max_tokens"]


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


#: rounds of :func:`decide_again` when the generation moves again during its own await (a decision-cache miss)
MAX_ROUNDS = 4


async def decide_again(gw: Gateway, held: Held, req: InferenceRequest, rec: RequestRecord, route_req: RouteRequest,
                       body: JsonObject | bytes, remaining: list[Replica], choice: RouteChoice, chains: ChainView,
                       ) -> tuple[JsonObject | bytes, list[Replica], Tenant, RouteChoice]:
    """Authorize ``req`` again with the registry and the policy now in force and enforce that answer
    (S17-6; session 18: R17-1, R17-2, R17-5 (c)). Called right before the upstream write of any attempt
    whose decision is older than the current :attr:`gateway.pep.DecisionPoint.generation`, and so again for
    an attempt the upstream pool did not write because the generation moved while it waited for a
    connection (session 19, S19-RC6: the same attempt, its ``choice`` kept; not counted again, no verdict).

    The whole authorization step of the request's admission runs again, as for a fresh request:
    the workload's tenant is resolved again (403 ``unknown_workload`` when the workload or its tenant
    is gone; 503 ``tenant_changed`` when the workload now belongs to another tenant: the request was
    admitted, counted and queued under the first one, a retry is admitted under the new one),
    :meth:`gateway.admission.Admission.check_request` (the same 404/400 as a fresh request), the
    tenant's per-request bounds now (:meth:`gateway.admission.Admission.request_bounds`) against the
    counts the request kept (:func:`check_kept_bounds`, S19-R6: the same 400 as a fresh request), the
    candidates are those of the first decision in the tenant's pools now (``TenantPoolFilter``: a
    reload narrows them, never widens them; none: 503 ``no_replica`` with its cause,
    :func:`gateway.pipeline_answer.no_candidate_error`), the policy decides (``held.decided``: ``(generation,
    identity, candidates)``; the tenant's queued count as of now) and ``max_tokens`` is clamped with
    the new tenant and decision; ``held.drop_cached`` (``usage_cached_tokens``) and the upstream ``user``
    (``forward_user``) are derived again from the tenant now (R18-2). When the generation moves again
    during this step's own await (a decision-cache miss), the step runs again (at most
    :data:`MAX_ROUNDS` times, then 503 ``policy_unavailable``: fail closed). The record takes the decision enforced (its fields are
    cleared first: a refusal before the decision records none, as for a fresh request).

    Enforced: a deny raises its 403 (:meth:`gateway.pep.PolicyEnforcementPoint.enforce`); ``remaining``
    (the attempt's replicas) is narrowed to the new decision's allowed replicas (R17-2: a retry stays
    inside them); a replica flow control released the request to (``choice``, first attempt with flow
    control) the new decision no longer allows raises 503 ``no_replica`` (its slot is not moved); a
    replica the router chose (flow control off, or a retry) is chosen again among the narrowed ones
    (``chains``: the router's input). A lower ``max_tokens`` cap is written into ``body`` (a dict, or
    the queued JSON bytes) and the ledger's reservation is lowered; a higher one is not taken (the
    request was admitted and queued with the lower one).

    The identity is the one the token established when the request arrived: a token that expires
    while its request waits is not checked again (R17-5 (b), docs/security.md "Session 18: recheck"):
    authentication is an arrival event (RFC 7519 4.1.4: not *accepted for processing* after ``exp``;
    Envoy's and OPA-Envoy's checks run once per request at the edge); this step re-authorizes the
    accepted request, it does not re-authenticate it; the same holds with or without a change.

    Returns:
        ``(body, remaining, tenant, choice)``: the upstream body to send (a copy of ``body`` with the
        ``user`` now and the lower ``max_tokens``, if lower), the narrowed replicas, the tenant now, the replica to send to.

    Raises:
        GatewayError: 403 (``unknown_workload``, a deny), 404/400 (:meth:`check_request`), 400
            (:func:`check_kept_bounds`), 503
            ``tenant_changed``, ``policy_unavailable`` (the decision point fails: fail closed) or
            ``no_replica``.
    """
    assert held.decided is not None
    _, identity, first = held.decided
    gw_pep, adm = gw.pep, gw.admission
    rec.decided(None)  # superseded: the record takes what is enforced now
    doc: dict[str, Any] = loads_object(body) if isinstance(body, bytes) else {**body}  # the parse accepted it
    for _ in range(MAX_ROUNDS):
        generation = gw_pep.pdp.generation
        tenant = adm.resolve_tenant(identity)  # 403 unknown_workload
        if tenant.id != rec.tenant_id:
            raise GatewayError(503, "tenant_changed", "this workload's tenant changed while the request waited; "
                               "send it again")
        bounds = adm.request_bounds(tenant)  # S19-R6: a fresh request's bounds, in a fresh request's order
        check_kept_bounds(bounds, req, route_req.prompt_tokens, doc.get("messages"), parsed=True)
        adm.check_request(req, tenant)
        check_kept_bounds(bounds, req, route_req.prompt_tokens, None, parsed=False)
        candidates = TenantPoolFilter(tenant.pools).filter(first)
        if not candidates:  # which cause, by the first check's rule (session 25, S24-fixreg-1)
            raise no_candidate_error(gw.replica_set.all(), tenant.pools, tenant.id, gw.metrics)
        decision = gw_pep.decide_now(identity, tenant, req, route_req.prompt_tokens, candidates, rec.endpoint,
                                     gw.flow.tenant_queued(tenant.id) if gw.flow is not None else 0)
        if type(decision) is not Decision:
            decision = await awaited_decision(decision, rec)  # type: ignore[arg-type]
        if gw_pep.pdp.generation == generation:
            break
    else:
        raise GatewayError(503, "policy_unavailable", "the policy kept changing while it was asked; retry")
    held.decided = (generation, identity, candidates)
    rec.decided(decision)
    gw_pep.enforce(decision)
    allowed = {r.id for r in gw_pep.allowed_candidates(candidates, decision)}
    remaining = [r for r in remaining if r.id in allowed]
    if choice.replica_id not in allowed:
        if not remaining or (gw.flow is not None and rec.attempts == 1):  # flow control's slot: not moved
            raise GatewayError(503, "no_replica", "no healthy replica is allowed for this request",
                               extra={"decision_id": decision.decision_id})
        if held.ticket is not None:
            held.ticket.finish()  # the router's load ticket of the replica it chose first
        choice, held.ticket = gw.router.route(route_req, [r.id for r in remaining], chains.previous_chains())
    # R18-2: what the pipeline derived from the tenant at arrival, derived again from the tenant now
    held.drop_cached = drops_cached(tenant.usage_cached_tokens, gw.config.tenancy.usage_cached_tokens)
    changes: dict[str, Any] = {"user": gw.keys.upstream_user(tenant, identity)}  # None: not sent
    max_tokens = adm.clamp_max_tokens(req.max_tokens, tenant, decision)
    if rec.max_tokens is not None and max_tokens < rec.max_tokens:
        rec.max_tokens = changes["max_tokens"] = max_tokens
        if held.reservation is not None:
            adm.lower_reservation(held.reservation, max_tokens * route_req.sequences)
    return _changed(doc, changes, isinstance(body, bytes)), remaining, tenant, choice


def check_kept_bounds(bounds: RequestBounds, req: InferenceRequest, prompt_tokens: int, messages: Any, *,
                      parsed: bool) -> None:
    """The tenant's per-request ``bounds`` (:mod:`tenancy.bounds`) checked again on what a request admitted
    before a change kept (S19-R6; :func:`decide_again`): ``parsed`` True, the parse's bounds
    (:func:`gateway.request.parse_inference_request`: ``messages``, the chat messages of the body it sends,
    against ``max_messages``; its sequences, ``len(req.prompts)``, against ``max_batch_prompts``); False, the
    prompt's (:meth:`gateway.admission.Admission.prompt_tokens`: each sequence's UTF-8 bytes,
    ``req.prompt_bytes``, against ``max_prompt_bytes``; ``prompt_tokens``, the request's counted prompt
    tokens, against ``max_prompt_tokens``). A queued request keeps its counts, not its prompt text
    (R12-2): one sequence's count is ``prompt_tokens``; a batch's longest sequence's count is kept in
    ``req.longest_prompt_tokens`` (set by :meth:`gateway.admission.Admission.prompt_tokens`; session 20,
    fixq-2), so each prompt is checked against ``max_prompt_tokens`` exactly as at arrival (before: the
    total against ``max_prompt_tokens`` x sequences, one long prompt beside short ones passed). A batch whose
    longest count is not known is checked on its total, which bounds every prompt (fail closed).

    Raises:
        GatewayError: 400 with a fresh request's code: ``too_many_messages``, ``too_many_content_parts``,
            ``batch_too_large``, ``prompt_too_large`` or ``context_length_exceeded``.
    """
    if parsed:
        if req.endpoint == "chat" and isinstance(messages, list):
            limit = bounds.max_messages
            if len(messages) > limit:
                raise GatewayError(400, "too_many_messages", f"messages has {len(messages)} entries; this "
                                   f"tenant's limit is {limit}", param="messages", client_text=True)
            if (units := chat_units(messages)) > limit:
                raise GatewayError(400, "too_many_content_parts", f"messages hold {units} messages, content parts "
                                   f"and tool calls together; this tenant's limit is {limit}",
                                   param="messages", client_text=True)
        if req.endpoint == "completions" and len(req.prompts) > bounds.max_batch_prompts:
            raise GatewayError(400, "batch_too_large", f"prompt is a batch of {len(req.prompts)} prompts; this "
                               f"tenant's limit is {bounds.max_batch_prompts}", param="prompt", client_text=True)
        return
    max_bytes, limit = bounds.max_prompt_bytes, bounds.max_prompt_tokens
    if max_bytes is not None:
        check_prompt_bytes(req.prompt_bytes, max_bytes)
    seqs = len(req.prompts) or 1
    longest = req.longest_prompt_tokens if seqs > 1 else None
    if limit is not None and (prompt_tokens if longest is None else longest) > limit:
        raise GatewayError(400, "context_length_exceeded", f"prompt has more than {limit} tokens; this tenant's "
                           f"limit is {limit}" + (" per prompt" if seqs > 1 else ""))


def with_fields(body: JsonObject | bytes, changes: dict[str, Any]) -> JsonObject | bytes:
    """``body`` with each field of ``changes`` set (a value of None removes the field): a new dict, or
    for the queued JSON bytes (:func:`gateway.flow_bytes.queued_form`) the bytes of the same object with
    those values changed (key order kept: what :func:`gateway.proxy.open_upstream` would send)."""
    doc: dict[str, Any] = loads_object(body) if isinstance(body, bytes) else {**body}  # the parse accepted it
    return _changed(doc, changes, isinstance(body, bytes))


def _changed(doc: dict[str, Any], changes: dict[str, Any], as_bytes: bool) -> JsonObject | bytes:
    """``doc`` (a copy the caller owns) with ``changes`` set (:func:`with_fields`), as JSON bytes when ``as_bytes``."""
    for name, value in changes.items():
        if value is None:
            doc.pop(name, None)
        else:
            doc[name] = value
    return bytes(dumps(doc)) if as_bytes else doc


def with_max_tokens(body: JsonObject | bytes, max_tokens: int) -> JsonObject | bytes:
    """``body`` with ``max_tokens`` replaced (:func:`with_fields`)."""
    return with_fields(body, {"max_tokens": max_tokens})
