"""Session 18, helper recheck (R17-1, R17-5 (b)): a registry reload acknowledged while a request waits in the
flow queue holds for that request as for a fresh one. When the request leaves the queue the whole authorization
step of its admission runs again (gateway/pep_recheck.py ``decide_again``): the tenant resolved again, its
entitlement checked again, the candidates in its pools now, the policy asked, ``max_tokens`` clamped with the
new tenant. Each reload case answered 200 on the old facts before (review probe
/tmp/s17-review/tree/tests/gateway/test_r17_probe_registry.py); the audit event records what was enforced.
A token that expires while its request waits is served, with or without a change (R17-5 (b), decided:
authentication is an arrival event; docs/security.md "Session 18: recheck")."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import jwt
import pytest
import yaml

from tests.support import flow
from tests.support import audit_log as audit_fixtures
from tests.support.audit_log import ListLog
from tests.support.flow import HOLD_UNTIL_CANCELLED, HOLDING_TOKENS, post, queued, running
from tests.support.waiting import wait_for

audit_log, audit_hub = audit_fixtures.audit_log, audit_fixtures.audit_hub  # the stack on a ListLog

replica_cfg, n_replicas = flow.replica_cfg, flow.n_replicas  # one slow replica
TD = "demo.prefixgate.test"


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    # leeway 0: a token is expired as soon as its exp is past (the R17-5 (b) case waits for that)
    return {**HOLD_UNTIL_CANCELLED, "flow": {"replica_max_running_requests": 1}, "identity": {"leeway_s": 0}}


async def reload(stack: Any, change: Any) -> None:
    """Rewrite gateway.yaml's tenants with ``change(tenants)`` and reload them (200 expected)."""
    p = stack.tmp / "gateway.yaml"
    doc = yaml.safe_load(p.read_text())
    change(doc["tenancy"]["tenants"])
    p.write_text(yaml.safe_dump(doc))
    r = await stack.client.post(f"{stack.admin_url}/admin/tenants/reload", headers=stack.operator_auth())
    assert r.status_code == 200, r.text


def tenant_a(**fields: Any) -> Any:
    def change(tenants: list[dict[str, Any]]) -> None:
        for t in tenants:
            if t["id"] == "tenant-a":
                t.update(fields)
    return change


def event_of(log: ListLog, answer: Any) -> Any:
    """The one audit event of the request ``answer`` answered (its ``X-Request-Id``)."""
    (ev,) = [e for e in log.events if e.request_id == answer.headers["x-request-id"]]
    return ev


async def queued_through(stack: Any, change: Any, *,
                         headers: dict[str, str] | Callable[[], dict[str, str]] | None = None,
                         fresh: bool = True, moves: bool = True, prompt: Any = flow.PROMPT) -> tuple[Any, Any]:
    """A request of tenant-a (``prompt``) queued behind one holding the replica; ``change`` (a reload, or any
    coroutine function of the stack) made while it waits (``moves``: it moves the decision point's
generation); then the holder cancelled. Returns the fresh
    request's answer after the change (None when ``fresh`` is false) and the queued request's.
    ``headers``: the queued request's headers, or a function called for them just before it is sent."""
    await reload(stack, tenant_a(max_output_tokens=HOLDING_TOKENS))  # the holder holds however slow the machine
    first = post(stack, HOLDING_TOKENS, timeout=None)
    await wait_for(lambda: running(stack) == 1 or first.done(), 60, what="first request running")
    assert not first.done()
    second = asyncio.ensure_future(stack.client.post(
        "/v1/completions", json={"model": "sim-model", "prompt": prompt, "max_tokens": 20},
        headers=(headers() if callable(headers) else headers) or stack.auth(), timeout=None))
    try:
        await wait_for(lambda: queued(stack) == 1 or second.done(), 60, what="second request queued")
        assert not second.done()
        gen = stack.components.pdp.generation
        await change(stack)
        assert (stack.components.pdp.generation > gen) is moves and queued(stack) == 1  # still queued
        answer = None
        if fresh:  # refused before the queue: never waits behind the holder
            answer = await stack.client.post("/v1/completions", json={"model": "sim-model", "prompt": "hi",
                                                                      "max_tokens": 20}, headers=stack.auth())
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        return answer, await second
    finally:
        first.cancel()
        second.cancel()


async def test_a_model_revoked_while_queued_refuses_the_queued_request_as_a_fresh_one(
        stack: Any, audit_log: ListLog) -> None:
    async def revoke(st: Any) -> None:
        await reload(st, tenant_a(models=["other-model"]))

    fresh, r = await queued_through(stack, revoke)
    assert fresh.status_code == 404
    assert (r.status_code, r.content) == (404, fresh.content)  # before: 200 on the revoked entitlement
    ev = event_of(audit_log, r)
    assert (ev.status_code, ev.error_code, ev.outcome.value) == (404, "model_not_found", "denied")
    assert ev.policy.reason_code == "model_not_entitled" and ev.policy.decision_id is None  # no decision enforced


async def test_pools_narrowed_while_queued_leave_no_replica(stack: Any, audit_log: ListLog) -> None:
    async def narrow(st: Any) -> None:
        await reload(st, tenant_a(pools=["eu"]))

    fresh, r = await queued_through(stack, narrow)
    assert fresh.status_code == 503 and fresh.json()["error"]["code"] == "no_replica"
    assert r.status_code == 503 and r.json()["error"]["code"] == "no_replica"  # before: 200 on r0 (pool default)
    assert stack.cluster.states[0].counters.requests == 1  # only the holder reached the replica
    ev = event_of(audit_log, r)
    assert (ev.status_code, ev.error_code) == (503, "no_replica")


async def test_an_output_cap_lowered_while_queued_is_sent_upstream(stack: Any, audit_log: ListLog) -> None:
    async def lower(st: Any) -> None:
        await reload(st, tenant_a(max_output_tokens=3))

    _, r = await queued_through(stack, lower, fresh=False)
    assert r.status_code == 200, r.text[:200]
    assert r.json()["usage"]["completion_tokens"] <= 3  # before: 20 (the old cap held)
    ev = event_of(audit_log, r)
    assert ev.status_code == 200 and ev.policy.decision_id and ev.output_tokens <= 3
    assert ev.ledger.reserved_tokens is not None


async def test_a_tenant_removed_while_queued_refuses_its_request(stack: Any, audit_log: ListLog) -> None:
    async def remove(st: Any) -> None:
        await reload(st, lambda tenants: tenants.__setitem__(
            slice(None), [t for t in tenants if t["id"] != "tenant-a"]))

    fresh, r = await queued_through(stack, remove)
    assert fresh.status_code == 403 and fresh.json()["error"]["code"] == "unknown_workload"
    assert r.status_code == 403 and r.json()["error"]["code"] == "unknown_workload"
    ev = event_of(audit_log, r)
    assert (ev.status_code, ev.error_code, ev.tenant) == (403, "unknown_workload", "tenant-a")


async def test_a_workload_moved_to_another_tenant_while_queued_is_sent_back(stack: Any) -> None:
    async def move(st: Any) -> None:
        def change(tenants: list[dict[str, Any]]) -> None:
            for t in tenants:
                if t["id"] == "tenant-a":
                    t["spiffe_ids"] = [f"spiffe://{TD}/elsewhere/"]
                if t["id"] == "tenant-b":
                    t["spiffe_ids"] = [*t["spiffe_ids"], f"spiffe://{TD}/tenant-a/"]
        await reload(st, change)

    _, r = await queued_through(stack, move, fresh=False)  # a fresh one would queue (as tenant-b) behind the holder
    assert r.status_code == 503 and r.json()["error"]["code"] == "tenant_changed"  # admitted as tenant-a: retry
    again = await stack.client.post("/v1/completions", json={"model": "sim-model", "prompt": "hi", "max_tokens": 2},
                                    headers=stack.auth())
    assert again.status_code == 200  # the retry is admitted as tenant-b


@pytest.mark.parametrize("changed", [False, True])
async def test_a_token_expiring_while_queued_is_served_with_or_without_a_change(
        stack: Any, audit_log: ListLog, changed: bool) -> None:
    """R17-5 (b): the token authenticated the request at its arrival; it is not checked again when the
    request leaves the queue, whether or not a change makes the policy decide again (the same answer)."""
    # minted when the queued request is sent (session 30, flake30): minted before the helper's reload and
    # holder, its 2-3 s of validity (exp is whole seconds) could pass before the request arrived on a loaded
    # machine, which then got 401 instead of queuing
    minted: list[str] = []

    def fresh_token() -> dict[str, str]:
        minted.append(stack.token(ttl_s=3))
        return {"Authorization": f"Bearer {minted[-1]}"}

    async def expire(st: Any) -> None:
        exp = jwt.decode(minted[-1], options={"verify_signature": False})["exp"]
        await wait_for(lambda: time.time() > exp + 0.5, 30, what="the queued request's token expired")
        if changed:
            await reload(st, tenant_a())  # the same tenants: the generation moves, the policy decides again

    _, r = await queued_through(stack, expire, headers=fresh_token, fresh=False, moves=changed)
    (token,) = minted
    assert r.status_code == 200, r.text[:200]
    expired = await stack.client.post("/v1/completions", json={"model": "sim-model", "prompt": "hi"},
                                      headers={"Authorization": f"Bearer {token}"})
    assert expired.status_code == 401  # a new request with it is refused
    ev = event_of(audit_log, r)
    assert ev.status_code == 200 and ev.identity.spiffe_id.endswith("/tenant-a/app")

# --- Session 18 review (merged here from test_s18_review_recheck.py: same stack and fixtures) ---
# Session 18 review of the re-decision after a registry reload (helper recheck, gateway/pep_recheck.py).
#
# R18-2: ``decide_again`` resolves the tenant again and returns it to the pipeline, but the facts the
# pipeline derived from the tenant at arrival stay: ``held.drop_cached`` (gateway/pipeline.py, set from
# ``tenant.usage_cached_tokens`` right after ``resolve_tenant``) is never recomputed. A reload that turns a
# tenant's ``usage_cached_tokens`` from ``pass`` to ``drop`` (R12-1: ``cached_tokens`` is a prefix-cache
# timing oracle) does not hold for a request queued before it: the answer relays ``cached_tokens``, which a
# fresh request after the reload does not get. (Same class: the upstream ``user`` field built by
# ``upstream_user(tenant, identity)`` before the queue, per the old ``forward_user``.)
#
# R18-3: on the queued path ``decide_again`` runs ``Admission.check_request(req, tenant)`` on a request whose
# ``req.body`` was emptied in place by ``gateway.flow_bytes.queued_form`` (``req.body.clear()``): the
# ``echo`` + ``logprobs`` rule (R4-12, ``prompt_logprobs_not_allowed``) reads ``req.body`` and always passes.
# A reload that takes ``allow_prompt_logprobs`` away does not hold for a queued echo+logprobs request: it
# is served (vLLM computes prompt logprobs, an engine cost the gateway does not charge), while a fresh one
# is refused 400. The docstring of ``decide_again`` says check_request answers "the same 404/400 as a fresh
# request".


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
