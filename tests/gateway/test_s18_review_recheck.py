"""Session 18 review of the re-decision after a registry reload (helper recheck, gateway/pep_recheck.py).

R18-2: ``decide_again`` resolves the tenant again and returns it to the pipeline, but the facts the
pipeline derived from the tenant at arrival stay: ``held.drop_cached`` (gateway/pipeline.py, set from
``tenant.usage_cached_tokens`` right after ``resolve_tenant``) is never recomputed. A reload that turns a
tenant's ``usage_cached_tokens`` from ``pass`` to ``drop`` (R12-1: ``cached_tokens`` is a prefix-cache
timing oracle) does not hold for a request queued before it: the answer relays ``cached_tokens``, which a
fresh request after the reload does not get. (Same class: the upstream ``user`` field built by
``upstream_user(tenant, identity)`` before the queue, per the old ``forward_user``.)

R18-3: on the queued path ``decide_again`` runs ``Admission.check_request(req, tenant)`` on a request whose
``req.body`` was emptied in place by ``gateway.flow_bytes.queued_form`` (``req.body.clear()``): the
``echo`` + ``logprobs`` rule (R4-12, ``prompt_logprobs_not_allowed``) reads ``req.body`` and always passes.
A reload that takes ``allow_prompt_logprobs`` away does not hold for a queued echo+logprobs request: it
is served (vLLM computes prompt logprobs, an engine cost the gateway does not charge), while a fresh one
is refused 400. The docstring of ``decide_again`` says check_request answers "the same 404/400 as a fresh
request".
"""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.auditing import AuditHub
from tests.gateway.test_s18_recheck_registry import queued_through, reload, tenant_a
from tests.support import flow
from tests.support.audit_log import ListLog
from tests.support.flow import HOLD_UNTIL_CANCELLED, HOLDING_TOKENS, post, queued, running
from tests.support.waiting import wait_for

replica_cfg, n_replicas = flow.replica_cfg, flow.n_replicas  # one slow replica


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    return {**HOLD_UNTIL_CANCELLED, "flow": {"replica_max_running_requests": 1}}


@pytest.fixture
def audit_log() -> ListLog:
    return ListLog()


@pytest.fixture
def audit_hub(audit_log: ListLog) -> AuditHub:
    return AuditHub(audit_log)


def _cached_in(answer: Any) -> bool:
    return "cached_tokens" in (answer.json()["usage"].get("prompt_tokens_details") or {})


async def test_cached_tokens_dropped_by_a_reload_while_queued_are_not_relayed(stack: Any) -> None:
    await reload(stack, tenant_a(usage_cached_tokens="pass"))
    before = await stack.client.post("/v1/completions", json={"model": "sim-model", "prompt": "hi", "max_tokens": 2},
                                     headers=stack.auth())
    assert before.status_code == 200 and _cached_in(before)  # the replica reports it; pass relays it

    async def drop(st: Any) -> None:
        await reload(st, tenant_a(usage_cached_tokens="drop"))

    _, r = await queued_through(stack, drop, fresh=False)
    fresh = await stack.client.post("/v1/completions", json={"model": "sim-model", "prompt": "hi", "max_tokens": 2},
                                    headers=stack.auth())
    assert fresh.status_code == 200 and not _cached_in(fresh)  # the reload holds for a fresh request
    assert r.status_code == 200, r.text[:200]
    assert not _cached_in(r), "the queued request's answer relays cached_tokens after the reload to drop"


ECHO = {"model": "sim-model", "prompt": flow.PROMPT, "max_tokens": 2, "echo": True, "logprobs": 1}


async def test_prompt_logprobs_taken_away_while_queued_refuse_the_queued_request(stack: Any) -> None:
    await reload(stack, tenant_a(allow_prompt_logprobs=True, max_output_tokens=HOLDING_TOKENS))
    first = post(stack, HOLDING_TOKENS, timeout=None)
    second = None
    try:
        await wait_for(lambda: running(stack) == 1 or first.done(), 60, what="first request running")
        assert not first.done()
        second = asyncio.ensure_future(stack.client.post("/v1/completions", json=ECHO, headers=stack.auth(),
                                                         timeout=None))
        await wait_for(lambda: queued(stack) == 1 or second.done(), 60, what="echo request queued")
        assert not second.done()
        await reload(stack, tenant_a(allow_prompt_logprobs=False))
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        r = await second
    finally:
        first.cancel()
        if second is not None:
            second.cancel()
    fresh = await stack.client.post("/v1/completions", json=ECHO, headers=stack.auth())
    assert fresh.status_code == 400 and fresh.json()["error"]["code"] == "prompt_logprobs_not_allowed"
    assert r.status_code == 400, f"the queued echo+logprobs request was served: {r.status_code}"
