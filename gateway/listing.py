"""``GET /v1/models``: the tenant's models, audited and rate-limited like the inference routes (R5-4).

One request of the listing: fail closed while the audit trail does not accept
events (as the inference routes do), authenticate, resolve the tenant, take one
request unit of the tenant's ``rate_rps`` bucket through
:meth:`gateway.admission.Admission.admit` (the inference routes' admission, with
``slot=False``: a listing holds no concurrency slot; the lease is released at
once), then answer 200 with the tenant's models. Every answer carries the
``X-Request-Id`` of its one audit event: a refusal's through
:func:`gateway.admin.record_refusal`, the listing's own (outcome ``allowed``,
endpoint :data:`MODELS_ENDPOINT`) here. A flood of listings is summarised per
(source, tenant, identity) by the audit trail's flood aggregation
(:data:`audit.summary.DEFAULT_SUMMARIZED_ENDPOINTS`), as refusals are.
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.admin import record_refusal
from gateway.build import Gateway
from gateway.errors import GatewayError
from gateway.identity import WorkloadIdentity
from gateway.record import RequestRecord, new_request_id

__all__ = ["MODELS_ENDPOINT", "list_models"]

#: ``endpoint`` of the listing's audit events (refusals included)
MODELS_ENDPOINT = "/v1/models"


async def list_models(c: Gateway, request: Request) -> Response:
    """Answer one ``GET /v1/models`` of ``request`` over the gateway ``c``.

    200: ``{"object": "list", "data": [{"id", "object": "model", "owned_by", "created"}, …]}``,
    the models :meth:`gateway.admission.Admission.listed_models` gives the caller's tenant.
    Refusals (never raised; answered): 503 ``audit_unavailable`` (audit trail not accepting),
    401 (credential), 403 ``unknown_workload``, 429 ``rate_limited`` (``Retry-After``), 503
    ``state_unavailable`` (shared limits down, ``fail_closed``). Each answer has ``X-Request-Id``.
    """
    identity: WorkloadIdentity | None = None
    tenant_id: str | None = None
    t0 = time.perf_counter()
    try:
        if not c.audit.accepting:  # fail closed, as the inference routes (gateway/pipeline.py)
            raise GatewayError(503, "audit_unavailable", "audit trail unavailable; refusing to serve without it")
        identity = await c.authn.authenticate(request)
        tenant = c.admission.resolve_tenant(identity)
        tenant_id = tenant.id
        (await c.admission.admit(tenant, slot=False)).release()  # one request unit, no concurrency slot
    except GatewayError as err:
        record_refusal(c.audit, c.authn, request, MODELS_ENDPOINT, err, identity, tenant_id)
        return err.response()
    data = [{"id": m, "object": "model", "owned_by": "prefixgate", "created": 0}
            for m in c.admission.listed_models(tenant)]
    rec = RequestRecord(request_id=new_request_id(), endpoint=MODELS_ENDPOINT, client_addr=c.authn.source(request),
                        t0=t0, spiffe_id=str(identity.spiffe_id), trust_domain=identity.trust_domain,
                        tenant_id=tenant_id, status=200, outcome="allowed")
    rec.t_end = time.perf_counter()
    c.audit.record_request(rec)
    return JSONResponse({"object": "list", "data": data}, headers={"X-Request-Id": rec.request_id})
