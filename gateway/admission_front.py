"""The request's front as one metered step: parse, entitlement, prompt room and prompt tokens (issue 14, session 19).

:func:`parse_and_count` runs, for a single-sequence request whose prompt is tokenized on the event loop, what
gateway/pipeline.py did as two :meth:`gateway.cpu_budget.CpuMeter.run` steps and four :class:`Admission`
calls: :func:`gateway.request.parse_inference_request`, :meth:`Admission.check_request`,
:meth:`Admission.prompt_room` and :meth:`Admission.prompt_tokens`, in that order, with the same answers. The
rules stay where they are: the entitlement and the prompt room are tested inline only for "nothing to do"
(the methods run, and raise, when a test says otherwise), and the prompt is counted by
:meth:`Admission.prompt_tokens` itself. A batch (it takes its sequences' request units between the two halves,
an await) and a prompt tokenized off the loop (R12-3) stop after the entitlement: the pipeline goes on step by
step as before.

The audit record of a refusal (review of session 18, "left" 1): a refusal raised inside the step carries the
record fields the pipeline's step-by-step order had set before it in ``GatewayError.record`` (read by
:meth:`gateway.record.RequestRecord.refused`): ``stream``, ``sequences`` and ``dropped_fields`` (session 24) once the
body parsed, ``model`` once the entitlement passed, ``t_parsed`` once the prompt step began. A refusal of the parse
itself carries none.
A bug (any other exception) after the parse is raised as :class:`gateway.errors.StepFailed` ``from`` it, with
the same fields (session 20, S19-T4-1): the pipeline's 500 ``internal_error`` record keeps them.
"""

from __future__ import annotations

import time

from gateway.admission import Admission
from gateway.config_http import LimitsConfig
from gateway.errors import GatewayError, StepFailed
from gateway.request import Endpoint, InferenceRequest, parse_inference_request
from gateway.tokenize_thread import tokenizes_off_loop
from tenancy.bounds import RequestBounds
from tenancy.limits import Lease
from tenancy.registry import Tenant
from tenancy.shared_limiter import SharedLease

__all__ = ["Front", "parse_and_count"]

#: ``(request, sequences, token ids to hash, prompt tokens, t_parsed)``; the last three None when the step stopped
#: after the entitlement (a batch, or a prompt tokenized off the loop)
Front = tuple[InferenceRequest, int, list[int] | None, int | None, float | None]


def parse_and_count(adm: Admission, raw: bytes, endpoint: Endpoint, limits: LimitsConfig, bounds: RequestBounds,
                    tenant: Tenant, lease: Lease | SharedLease, thread: bool) -> Front:
    """Parse ``raw`` (the body of ``endpoint``; ``limits``: ``max_json_depth``, ``max_json_items``, ``max_tools``,
    ``unknown_fields``, ``json_schema`` (with ``tenant``'s ``json_schema_limits``); ``bounds``:
    the tenant's :meth:`Admission.request_bounds`), check it against ``tenant``'s entitlements, then, for one
    sequence tokenized here (``thread``: the gateway has a tokenizer thread, :mod:`gateway.tokenize_thread`),
    its prompt against the tenant's prompt-token room (``lease``: its admission's) and bounds.

    Returns :data:`Front`: ``t_parsed`` is the perf-counter time after the entitlement (the record's mark).
    Raises what the four steps raise (:class:`GatewayError` 400 ``invalid_json``..., 404 ``model_not_found``,
    400 ``prompt_logprobs_not_allowed``, 400 ``prompt_too_large`` / ``context_length_exceeded``, 429
    ``token_rate_limited``), each with the record fields described in the module docstring;
    :class:`gateway.errors.StepFailed` (a bug after the parse, with the same fields)."""
    req = parse_inference_request(raw, endpoint, limits.max_json_depth, max_messages=bounds.max_messages,
                                  max_batch_prompts=bounds.max_batch_prompts, max_json_items=limits.max_json_items,
                                  max_tools=limits.max_tools, max_free_values=bounds.max_free_values,
                                  unknown_fields=limits.unknown_fields, json_schema=limits.json_schema,
                                  json_schema_tenant=tenant.json_schema_limits, tenant_id=tenant.id)
    seqs = len(req.prompts) or 1  # = req.sequences, without the property's call (session 17)
    try:  # = adm.check_request(req, tenant): it runs (and raises) only when one of its tests fails
        if ((model := req.model) not in tenant.models or model not in adm.served_models
                or (req.prompt_logprobs and not tenant.allow_prompt_logprobs)):
            adm.check_request(req, tenant)
    except GatewayError as err:
        err.record = {"stream": req.stream, "sequences": seqs, "dropped_fields": req.dropped[0], **err.record}
        raise
    except Exception as bug:  # S19-T4-1: a bug's 500 keeps them too
        raise StepFailed({"stream": req.stream, "sequences": seqs}) from bug
    t_parsed: float | None = None
    try:
        if seqs > 1 or (thread and tokenizes_off_loop(adm.tokenizer, req)):
            return req, seqs, None, None, None
        t_parsed = time.perf_counter()
        # = adm.prompt_room(tenant, lease): the in-process ledger's None for a tenant without a prompt-token limit
        room = None if adm.local and tenant.prompt_tokens_per_s is None else adm.prompt_room(tenant, lease)
        tokens, prompt_tokens = adm.prompt_tokens(bounds, req, room)
    except GatewayError as err:
        err.record = {"stream": req.stream, "sequences": seqs, "model": model, "t_parsed": t_parsed,
                      "dropped_fields": req.dropped[0], **err.record}
        raise
    except Exception as bug:  # S19-T4-1
        raise StepFailed({"stream": req.stream, "sequences": seqs, "model": model, "t_parsed": t_parsed}) from bug
    return req, seqs, tokens, prompt_tokens, t_parsed
